//! A [`Mirror`] of the registry kept current by one watch, for one holder that applies the
//! changes itself when it asks for them: fleetctl-side waits and tests. A process that
//! plans or serves listings from memory shares one [`Store`](crate::Store) instead.
//!
//! The engine leader planned on this view before the store: re-reading and decoding
//! everything for every pass cost it most of its CPU and memory at 1,000 units and ~6.5 MiB
//! of etcd reads per pass at 10,000 (see docs/benchmarks.md).

use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Revision, WatchMessage};
use crate::mirror::{Changed, Mirror, Touched};
use crate::read::Skipped;
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// The registry's units, machines and their metadata, schedule, states, unschedulable reasons and unit files,
/// followed by a watch.
#[derive(Debug)]
pub struct LiveView {
    mirror: Mirror,
    /// The watch's messages, drained from it as they come.
    watch: mpsc::UnboundedReceiver<WatchMessage>,
    /// What changed since [`take_changed_units`](Self::take_changed_units) last asked.
    changed: Changed,
}

impl LiveView {
    /// Reads everything, unit files included, at one revision and watches from the next.
    pub async fn start<K: Kv>(registry: Registry<K>) -> Result<LiveView> {
        LiveView::read(registry, true).await
    }

    /// As [`start`](Self::start), without the unit files: [`files`](Self::files) stays empty.
    pub async fn start_without_files<K: Kv>(registry: Registry<K>) -> Result<LiveView> {
        LiveView::read(registry, false).await
    }

    async fn read<K: Kv>(registry: Registry<K>, with_files: bool) -> Result<LiveView> {
        let (mirror, watch) = Mirror::read(&registry, with_files).await?;
        Ok(LiveView {
            mirror,
            watch,
            changed: Changed::default(),
        })
    }

    /// The units whose record or file changed since the last call (or since the view was
    /// read), and forgets them; `None` when a change could not be traced to its units (a
    /// key that does not parse).
    pub fn take_changed_units(&mut self) -> Option<BTreeSet<UnitName>> {
        std::mem::take(&mut self.changed).units(&self.mirror.snapshot)
    }

    /// The registry as of [`revision`](Self::revision).
    pub fn snapshot(&self) -> &Snapshot {
        &self.mirror.snapshot
    }

    /// Every readable unit file in the registry, by hash (none without files).
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

    /// Waits for the next change and applies it, with every change that has already arrived
    /// after it (a burst becomes one batch). An error means the view cannot follow any more
    /// (the watch ended or fell behind a compaction): drop it and start a new one. A value
    /// that cannot be read is skipped, never an error.
    pub async fn changed(&mut self) -> Result<Touched> {
        let first = self.watch.recv().await;
        let mut touched = self.mirror.apply_message(first, &mut self.changed)?;
        touched.merge(self.catch_up()?);
        Ok(touched)
    }

    /// Applies every change that has already arrived, without waiting for one: a holder
    /// that reads the view now and then keeps it current, and its backlog small, this way.
    /// An error means the view cannot follow any more, as in [`changed`](Self::changed).
    pub fn catch_up(&mut self) -> Result<Touched> {
        let mut touched = Touched::default();
        loop {
            match self.watch.try_recv() {
                Ok(message) => {
                    let applied = self.mirror.apply_message(Some(message), &mut self.changed);
                    touched.merge(applied?);
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(touched),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(RegistryError::ViewLost("watch stream ended".to_owned()));
                }
            }
        }
    }
}
