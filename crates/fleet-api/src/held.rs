//! The unit listing served from a view of the registry that fleetd's API holds (issue 19).
//!
//! A listing of every unit read from etcd costs the same each time: at 100,000 units,
//! reading, decoding and placing 400,000 keys for every `fleetctl list-unit-files` over the
//! API (two pages of 65,535, one after the other) took 2 s on 2 cores, half of it etcd's.
//! A [`HeldView`] holds the process's [`Store`] of the registry (one read, then one watch;
//! shared with the engine leader when both run in one fleetd, see [`SharedStore`]) and
//! builds the pages from memory.
//!
//! - **Read your writes.** Each listing first reads the present revision (one key, a
//!   linearizable read) and waits until the view has applied every change up to it, at most
//!   [`CATCH_UP_WITHIN`]. A listing so sees every write that finished before it began, as a
//!   read of etcd would. A view still behind after that (a burst of changes, or writes
//!   outside the registry's prefix in a shared etcd, which no event of this watch ever
//!   reaches) is not used: the listing reads its page from etcd, as without a view, and
//!   later listings wait only [`CATCH_UP_STALLED`] until the view moves on. (etcd's progress
//!   notifications would tell a quiet prefix from a lagging watch, but etcd before 3.4.24,
//!   Debian 12's 3.4.23 among them, may send one ahead of a lagging watcher's events:
//!   etcd-io/etcd#15220.)
//! - **One revision.** The first page is the view at its revision, which its cursor
//!   carries. A later page comes from the view only while the view is still at that
//!   revision, else from etcd at it, as without a view: every page of a listing shows the
//!   registry as it was at its first. The full view's whole listing (`pageSize=0`) is one
//!   page. fleetctl asks for pages of 65,535, each of which costs the same from etcd at any
//!   size of the registry; a page also ends at [`PAGE_BYTES`](fleet_ops::etcd::page::PAGE_BYTES)
//!   of its units' files ([`page_of`]), from the view and from etcd alike.
//! - **Only while used.** The store is taken on the first listing (which waits for it at most
//!   [`START_WAIT`], then reads its page from etcd) and let go after [`HeldView::new`]'s
//!   `idle` without one (checked every [`CHECK_IDLE_EVERY`]), so a fleetd whose API nobody
//!   lists and that does not lead holds no copy of the registry and no watch of all of it.
//!   The store applies its watch as it comes, listed or not.
//! - **Failing open to etcd.** A store that cannot be read (etcd down, a permission) or that
//!   stops following (its watch broke, a compaction) is let go and the listing reads its
//!   page from etcd, which reports the failure if there is one; no store is taken again for
//!   [`RETRY_AFTER`]. A store is taken by a task of its own, so a client that gives up does
//!   not waste the read, and listings meanwhile read etcd.

use fleet_registry::kv::{Kv, Revision};
use fleet_registry::{Registry, RegistryError, SharedStore, Store, StoreRead};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{Mutex, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, info, warn};

pub use fleet_ops::etcd::page::{PageLimit, Report, page_of};
use fleet_ops::model::UnitListing;
use fleet_ops::{OpsError, UnitsCursor};

/// fleetd's: how long the API keeps its view without a listing.
pub const HELD_VIEW_IDLE: Duration = Duration::from_secs(300);

/// How long a listing waits for the view to apply the changes up to the present revision
/// before it reads its page from etcd instead.
pub const CATCH_UP_WITHIN: Duration = Duration::from_millis(500);

/// How long a listing waits for a view that has not moved since a listing last waited for
/// it in vain (writes outside the prefix keep the present ahead of it).
pub const CATCH_UP_STALLED: Duration = Duration::from_millis(50);

/// How long the listing that starts reading the view waits for it before reading its page
/// from etcd (the view goes on being read).
pub const START_WAIT: Duration = Duration::from_secs(1);

/// How often the holder checks whether nobody listed for the idle time.
pub const CHECK_IDLE_EVERY: Duration = Duration::from_secs(1);

/// After a view could not be read, listings read etcd for this long before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A view of the registry for listings, read when first needed (see the module's text).
#[derive(Debug)]
pub struct HeldView<K> {
    idle: Duration,
    /// Where the store comes from: the process's, shared with its engine.
    stores: SharedStore<K>,
    held: Arc<Mutex<Held>>,
}

#[derive(Debug)]
struct Held {
    view: Option<Store>,
    /// Which view the applying task serves: a task of a dropped view ends.
    generation: u64,
    used: Instant,
    /// A view is being read (by a task of its own, which a listing that gave up does not
    /// cancel).
    starting: bool,
    /// When a view may be read again after one could not be read or stopped following.
    retry_at: Option<Instant>,
    /// The view's revision when a listing last waited in vain for it to reach the present:
    /// until the view moves on, listings read etcd without waiting again.
    stalled_at: Option<Revision>,
}

/// Why a listing does not come from the view (the caller reads etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// The view could not be read, or stopped following, less than [`RETRY_AFTER`] ago.
    Unreadable,
    /// The view is being read (for longer than [`START_WAIT`], for the listing that
    /// started reading it).
    Starting,
    /// The view stopped following the registry and was dropped.
    Lost,
    /// The view had not applied the present revision within [`CATCH_UP_WITHIN`] (or has not
    /// moved since a listing last waited for it in vain).
    Behind,
    /// The registry changed since the revision the page was asked at.
    Moved,
}

impl Bypass {
    pub const ALL: [Bypass; 5] = [
        Bypass::Unreadable,
        Bypass::Starting,
        Bypass::Lost,
        Bypass::Behind,
        Bypass::Moved,
    ];

    /// The metric label of a page read from etcd for this reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Bypass::Unreadable => "unreadable",
            Bypass::Starting => "starting",
            Bypass::Lost => "lost",
            Bypass::Behind => "behind",
            Bypass::Moved => "moved",
        }
    }
}

impl<K: Kv> HeldView<K> {
    /// A view of the store of `stores`, let go after `idle` without a listing.
    pub fn new(idle: Duration, stores: SharedStore<K>) -> HeldView<K> {
        HeldView {
            idle,
            stores,
            held: Arc::new(Mutex::new(Held {
                view: None,
                generation: 0,
                used: Instant::now(),
                starting: false,
                retry_at: None,
                stalled_at: None,
            })),
        }
    }

    /// Whether a view is held now.
    pub async fn is_held(&self) -> bool {
        self.held.lock().await.view.is_some()
    }

    /// The units after `cursor` (from the first without one) that `limit` lets into a page
    /// ([`page_of`]), from the view once
    /// it has applied the present revision, and only if the present is `at` when one is
    /// asked (a later page of a listing); why not, when it cannot serve the page. Reading
    /// the present revision is the one error.
    pub async fn units_after(
        &self,
        registry: &Registry<K>,
        cursor: Option<&UnitsCursor>,
        limit: PageLimit,
        at: Option<Revision>,
        report: Report,
    ) -> Result<Result<(UnitListing, Option<UnitsCursor>), Bypass>, OpsError> {
        let after = cursor.map(|c| c.after.as_str());
        self.read_at(registry, at, |view| {
            page_of(
                view.snapshot(),
                view.files(),
                view.unreadable_files(),
                after,
                limit,
                report,
            )
        })
        .await
    }

    /// `read` of the view once it has applied the present revision (one snapshot: every
    /// change up to the present, none half applied), and only if the present is `at` when
    /// one is asked; why not, when the view cannot serve. Reading the present revision is
    /// the one error. `read` runs under the view's read lock: it only reads.
    pub async fn read_at<T>(
        &self,
        registry: &Registry<K>,
        at: Option<Revision>,
        read: impl FnOnce(&StoreRead<'_>) -> T,
    ) -> Result<Result<T, Bypass>, OpsError> {
        let present = registry
            .present_revision("reading the present revision for a listing")
            .await?;
        // The view is never behind the present it caught up with: a later page asked at an
        // older revision cannot come from it.
        if at.is_some_and(|at| at != present) {
            return Ok(Err(Bypass::Moved));
        }
        let mut held = self.held.lock().await;
        held.used = Instant::now();
        if held.view.is_none() {
            let started = match self.start(&mut held) {
                Ok(started) => started,
                Err(bypass) => return Ok(Err(bypass)),
            };
            // Not under the lock: listings meanwhile read etcd. A view slow to read (a
            // million units) is left to its task, and this page read from etcd, so that a
            // page never costs more than its own keys plus START_WAIT.
            drop(held);
            if tokio::time::timeout(START_WAIT, started).await.is_err() {
                return Ok(Err(Bypass::Starting));
            }
            held = self.held.lock().await;
        }
        if let Err(bypass) = caught_up(&mut held, present).await {
            return Ok(Err(bypass));
        }
        let Some(store) = &held.view else {
            return Ok(Err(Bypass::Lost));
        };
        let view: StoreRead<'_> = store.read().await;
        if at.is_some_and(|at| at != view.revision()) {
            return Ok(Err(Bypass::Moved));
        }
        Ok(Ok(read(&view)))
    }

    /// Starts reading a view in a task of its own, which installs it; the receiver hears
    /// when it is done (read or not).
    fn start(&self, held: &mut Held) -> Result<oneshot::Receiver<()>, Bypass> {
        if held.starting {
            return Err(Bypass::Starting);
        }
        if held.retry_at.is_some_and(|at| Instant::now() < at) {
            return Err(Bypass::Unreadable);
        }
        held.starting = true;
        let (done, started) = oneshot::channel();
        let shared = self.held.clone();
        let stores = self.stores.clone();
        let idle = self.idle;
        let task = async move {
            let read = stores.get().await;
            let mut held = shared.lock().await;
            held.starting = false;
            match read {
                Ok(store) => {
                    debug!(
                        revision = store.revision(),
                        "took the registry's store for listings"
                    );
                    held.view = Some(store);
                    held.generation += 1;
                    held.retry_at = None;
                    held.stalled_at = None;
                    let_go_when_idle(&shared, held.generation, idle);
                }
                Err(error) => {
                    warn!(%error, retry_in = ?RETRY_AFTER, "cannot read the registry's view for listings; listing from etcd");
                    held.retry_at = Some(Instant::now() + RETRY_AFTER);
                }
            }
            let _ = done.send(());
        };
        tokio::spawn(task.instrument(held_span()));
        Ok(started)
    }
}

/// The span of the view's own tasks: not the request's that happened to start them.
fn held_span() -> tracing::Span {
    tracing::debug_span!(parent: None, "listings_view")
}

/// Waits for the store to apply the changes up to `present`, at most [`CATCH_UP_WITHIN`],
/// unless a listing already waited in vain at the store's revision.
async fn caught_up(held: &mut Held, present: Revision) -> Result<(), Bypass> {
    let Some(store) = held.view.clone() else {
        return Err(Bypass::Lost);
    };
    // A store that did not move since a listing waited for it in vain is given only as long
    // as a write's event takes to arrive.
    let within = match held.stalled_at {
        Some(at) if at == store.revision() => CATCH_UP_STALLED,
        Some(_) | None => CATCH_UP_WITHIN,
    };
    match tokio::time::timeout(within, store.reached(present)).await {
        Ok(Ok(())) => {
            held.stalled_at = None;
            Ok(())
        }
        Ok(Err(error)) => Err(lost(held, &error)),
        Err(_) => {
            let revision = store.revision();
            debug!(
                view = revision,
                present, "the listings' view is behind the present; listing from etcd"
            );
            held.stalled_at = Some(revision);
            Err(Bypass::Behind)
        }
    }
}

/// Lets go of a store that stopped following; none is taken again for [`RETRY_AFTER`].
fn lost(held: &mut Held, error: &RegistryError) -> Bypass {
    info!(%error, retry_in = ?RETRY_AFTER, "the listings' view stopped following the registry; dropped");
    held.view = None;
    held.retry_at = Some(Instant::now() + RETRY_AFTER);
    Bypass::Lost
}

/// Lets go of store `generation` after `idle` without a listing (checked every
/// [`CHECK_IDLE_EVERY`]), or once it stopped following.
fn let_go_when_idle(shared: &Arc<Mutex<Held>>, generation: u64, idle: Duration) {
    let held: Weak<Mutex<Held>> = Arc::downgrade(shared);
    let task = async move {
        let mut tick = tokio::time::interval(CHECK_IDLE_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(held) = held.upgrade() else { return };
            let mut held = held.lock().await;
            if held.generation != generation {
                return;
            }
            if held.used.elapsed() >= idle {
                debug!(idle = ?idle, "no listing for a while: the listings' view is dropped");
                held.view = None;
                return;
            }
            let Some(store) = held.view.as_ref() else {
                return;
            };
            // At once: whether the store stopped following, and why.
            if let Err(error) = store.reached(0).await {
                lost(&mut held, &error);
                return;
            }
        }
    };
    tokio::spawn(task.instrument(held_span()));
}

#[cfg(test)]
mod tests;
