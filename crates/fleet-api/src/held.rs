//! The unit listing served from a view of the registry that fleetd's API holds (issue 19).
//!
//! A listing of every unit read from etcd costs the same each time: at 100,000 units,
//! reading, decoding and placing 400,000 keys for every `fleetctl list-unit-files` over the
//! API (two pages of 65,535, one after the other) took 2 s on 2 cores, half of it etcd's.
//! A [`HeldView`] reads the registry once ([`LiveView`], as the engine leader does), follows
//! it with one watch, and builds the pages from memory.
//!
//! - **Read your writes.** Each listing first reads the present revision (one key, a
//!   linearizable read) and waits until the view has applied every change up to it, at most
//!   [`CATCH_UP_WITHIN`]. A listing so sees every write that finished before it began, as a
//!   read of etcd would. A view still behind after that (a burst of changes, or writes
//!   outside the registry's prefix in a shared etcd, which no event of this watch ever
//!   reaches) is not used: the listing reads its page from etcd, as without a view.
//! - **One revision.** The first page is the view at its revision, which its cursor
//!   carries. A later page comes from the view only while the view is still at that
//!   revision, else from etcd at it, as without a view: every page of a listing shows the
//!   registry as it was at its first. The full view's whole listing (`pageSize=0`, what
//!   fleetctl asks) is one page.
//! - **Only while used.** The view is read on the first listing and dropped after
//!   [`HeldView::new`]'s `idle` without one, so a fleetd whose API nobody lists holds no
//!   copy of the registry and no watch of all of it. Between listings a task applies what
//!   the watch delivered every [`APPLY_EVERY`], so the backlog stays small.
//! - **Failing open to etcd.** A view that cannot be read (etcd down, a permission) or that
//!   stops following (its watch broke, a compaction) is dropped and the listing reads its
//!   page from etcd, which reports the failure if there is one; a view that could not be
//!   read is not tried again for [`RETRY_AFTER`].

use fleet_core::{UnitFile, UnitHash};
use fleet_registry::kv::{Kv, Revision};
use fleet_registry::{Key, LiveView, Registry, RegistryError, Skipped, Snapshot, Unit};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, info, warn};

use fleet_ops::etcd::views;
use fleet_ops::model::UnitListing;
use fleet_ops::{OpsError, UnitsCursor};

/// fleetd's: how long the API keeps its view without a listing.
pub const HELD_VIEW_IDLE: Duration = Duration::from_secs(300);

/// How long a listing waits for the view to apply the changes up to the present revision
/// before it reads its page from etcd instead.
pub const CATCH_UP_WITHIN: Duration = Duration::from_millis(500);

/// How often the view applies what its watch delivered while nobody lists.
pub const APPLY_EVERY: Duration = Duration::from_secs(1);

/// After a view could not be read, listings read etcd for this long before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A view of the registry for listings, read when first needed (see the module's text).
#[derive(Debug)]
pub struct HeldView<K> {
    idle: Duration,
    held: Arc<Mutex<Held<K>>>,
}

#[derive(Debug)]
struct Held<K> {
    view: Option<LiveView<K>>,
    /// Which view the applying task serves: a task of a dropped view ends.
    generation: u64,
    used: Instant,
    /// When a view could be read again after one could not.
    retry_at: Option<Instant>,
}

/// Why a listing does not come from the view (the caller reads etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// The view could not be read, now or less than [`RETRY_AFTER`] ago.
    Unreadable,
    /// The view stopped following the registry and was dropped.
    Lost,
    /// The view had not applied the present revision within [`CATCH_UP_WITHIN`].
    Behind,
    /// The registry changed since the revision the page was asked at.
    Moved,
}

impl<K: Kv> HeldView<K> {
    /// A view dropped after `idle` without a listing.
    pub fn new(idle: Duration) -> HeldView<K> {
        HeldView {
            idle,
            held: Arc::new(Mutex::new(Held {
                view: None,
                generation: 0,
                used: Instant::now(),
                retry_at: None,
            })),
        }
    }

    /// Whether a view is held now.
    pub async fn is_held(&self) -> bool {
        self.held.lock().await.view.is_some()
    }

    /// At most `limit` units after `cursor` (from the first without one), from the view once
    /// it has applied the present revision, and only if it is then `at` that revision when
    /// one is asked (a later page of a listing); why not, when it cannot serve the page.
    /// Reading the present revision is the one error.
    pub async fn units_after(
        &self,
        registry: &Registry<K>,
        cursor: Option<&UnitsCursor>,
        limit: usize,
        at: Option<Revision>,
    ) -> Result<Result<(UnitListing, Option<UnitsCursor>), Bypass>, OpsError> {
        let present = registry
            .present_revision("reading the present revision for a listing")
            .await?;
        let mut held = self.held.lock().await;
        held.used = Instant::now();
        if let Err(bypass) = self.caught_up(&mut held, registry, present).await {
            return Ok(Err(bypass));
        }
        let Some(view) = &held.view else {
            return Ok(Err(Bypass::Lost));
        };
        if at.is_some_and(|at| at != view.revision()) {
            return Ok(Err(Bypass::Moved));
        }
        let after = cursor.map(|c| c.after.as_str());
        Ok(Ok(page_of(
            view.snapshot(),
            view.files(),
            view.unreadable_files(),
            after,
            limit,
        )))
    }

    /// Reads the view if none is held, then applies its changes up to `present`.
    async fn caught_up(
        &self,
        held: &mut Held<K>,
        registry: &Registry<K>,
        present: Revision,
    ) -> Result<(), Bypass> {
        if held.view.is_none() {
            if held.retry_at.is_some_and(|at| Instant::now() < at) {
                return Err(Bypass::Unreadable);
            }
            match LiveView::start(registry.clone()).await {
                Ok(view) => {
                    debug!(
                        revision = view.revision(),
                        units = view.snapshot().units.len(),
                        "read the registry's view for listings"
                    );
                    held.view = Some(view);
                    held.generation += 1;
                    held.retry_at = None;
                    self.apply_while_held(held.generation);
                }
                Err(error) => {
                    warn!(%error, retry_in = ?RETRY_AFTER, "cannot read the registry's view for listings; listing from etcd");
                    held.retry_at = Some(Instant::now() + RETRY_AFTER);
                    return Err(Bypass::Unreadable);
                }
            }
        }
        let Some(view) = held.view.as_mut() else {
            return Err(Bypass::Lost);
        };
        let follow = async {
            view.catch_up()?;
            while view.revision() < present {
                view.changed().await?;
            }
            Ok::<_, RegistryError>(())
        };
        match tokio::time::timeout(CATCH_UP_WITHIN, follow).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                info!(%error, "the listings' view stopped following the registry; dropped");
                held.view = None;
                Err(Bypass::Lost)
            }
            Err(_) => {
                debug!(
                    view = view.revision(),
                    present, "the listings' view is behind the present; listing from etcd"
                );
                Err(Bypass::Behind)
            }
        }
    }

    /// Applies what the watch delivers every [`APPLY_EVERY`] while view `generation` is held
    /// and listed; drops it after `idle` without a listing.
    fn apply_while_held(&self, generation: u64) {
        let held: Weak<Mutex<Held<K>>> = Arc::downgrade(&self.held);
        let idle = self.idle;
        let task = async move {
            let mut tick = tokio::time::interval(APPLY_EVERY);
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
                let Some(view) = held.view.as_mut() else {
                    return;
                };
                if let Err(error) = view.catch_up() {
                    info!(%error, "the listings' view stopped following the registry; dropped");
                    held.view = None;
                    return;
                }
            }
        };
        tokio::spawn(task.in_current_span());
    }
}

/// At most `limit` units of `snap` after the unit named `after` (from the first without
/// one), with the cursor of the next page when more follow. A unit whose file is not in
/// `files` is left out, as a corrupt record is; the first page carries everything the view
/// could not read (`snap.skipped`, and the `unreadable` files a unit names).
pub fn page_of<'a>(
    snap: &'a Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    unreadable: impl Iterator<Item = &'a Skipped>,
    after: Option<&str>,
    limit: usize,
) -> (UnitListing, Option<UnitsCursor>) {
    let mut rest = snap
        .units
        .values()
        .skip_while(|u| after.is_some_and(|a| u.name().as_str() <= a));
    let page: Vec<&Unit> = rest.by_ref().take(limit).collect();
    let more = rest.next().is_some();
    let units = page
        .iter()
        .filter_map(|u| Some(views::unit_view(snap, u, files.get(&u.hash())?)))
        .collect();
    let skipped = match after {
        None => {
            // Only the files some unit names, as a listing from etcd reads only those.
            let mut unreadable = unreadable.peekable();
            let named: BTreeSet<UnitHash> = match unreadable.peek() {
                Some(_) => snap.units.values().map(Unit::hash).collect(),
                None => BTreeSet::new(),
            };
            let unreadable = unreadable.filter(
                |s| matches!(s.named.as_deref(), Some(Key::File(hash)) if named.contains(hash)),
            );
            snap.skipped
                .values()
                .chain(unreadable)
                .map(ToString::to_string)
                .collect()
        }
        Some(_) => Vec::new(),
    };
    let next = page.last().filter(|_| more).map(|u| UnitsCursor {
        after: u.name().to_string(),
        revision: snap.revision,
    });
    (UnitListing { units, skipped }, next)
}

#[cfg(test)]
mod tests;
