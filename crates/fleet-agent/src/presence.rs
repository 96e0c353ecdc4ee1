//! This machine's presence in the registry: registered on a lease, kept alive at TTL/3 (every
//! [`RENEWAL_RETRY`](fleet_registry::kv::RENEWAL_RETRY) after a failure, while the lease may
//! still be alive ([`next_renewal`]); each renewal waiting for etcd's answer as long as
//! [`renewal_window`] allows, not just the request deadline), and
//! registered again (a new lease, all states republished) if the lease ever expires, e.g.
//! after etcd was unreachable for longer than the TTL.
//!
//! The lease ID is kept in the runtime directory, so a restarted fleetd (even after kill -9)
//! takes over its own live lease: the machine never disappears from the cluster and its units'
//! states stay published. Another fleetd with the same machine ID has no such file and is
//! refused.
//!
//! fleetd runs one keeper beside its agent, which gets every new presence from it; the bench
//! runs one per simulated machine. It never touches units: losing the lease stops nothing.
//! It publishes the deadline of the machine's fence (`crate::fence`), which stops the units
//! only if fleetd stops publishing.
//!
//! While etcd does not answer, the keeper asks the other machines (`crate::witness`) whether
//! they reach it: if one does, this machine is cut off alone, and the fence is left (or put
//! back) at the last renewal's send time plus the TTL, which the lease cannot outlive.
//!
//! The first failed renewal of a run of failures is news too: the keeper sends the same
//! presence again. The agent takes any presence news to mean that the watch of its schedule
//! may be late (a partition, a frozen etcd), so that it re-reads the schedule instead of
//! applying the events one response at a time as they trickle in (see `Agent::run`).

use crate::fence::Deadline;
use crate::witness::{Evidence, Witnesses};
use fleet_core::{Backoff, MachineInfo};
use fleet_registry::kv::{Kv, KvError, LeaseId, next_renewal, renewal_window};
use fleet_registry::{MachineRole, Presence, RegistryError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, Span, info, info_span, warn};

/// A run of failed renewals or registrations, from the first failure to the next success.
#[derive(Debug, Default)]
struct FailureRun {
    /// The send time of the run's first failed request.
    since: Option<Instant>,
    /// Whether the peers said this machine is cut off (logged once per change).
    cut_off: bool,
}

/// Keeps one machine registered: `info` on a lease of `ttl`, whose ID is saved in `lease_file`.
#[derive(Debug)]
pub struct PresenceKeeper<K> {
    /// The role of this machine (`info.id`): it registers and keeps only that machine.
    pub registry: MachineRole<K>,
    pub info: MachineInfo,
    pub ttl: Duration,
    pub lease_file: PathBuf,
    /// Where the keeper publishes the fence's deadline (`fleet_core::fence`): after each
    /// successful renewal or registration, its send time plus the TTL, which the lease cannot
    /// expire before; while etcd does not answer, now plus the TTL (an alive fleetd that
    /// cannot reach etcd does not fence its units on that ground alone). `None`: no fence.
    pub fence: Option<watch::Sender<Option<Deadline>>>,
    /// The other machines, asked while etcd does not answer (`crate::witness`). `None`: no
    /// one is asked, and an alive fleetd never fences on etcd's silence.
    pub witnesses: Option<Arc<dyn Witnesses>>,
    /// Where the keeper publishes the send time of its last successful renewal (or
    /// registration): what this machine answers the peers that ask it (fleetd's health
    /// route). `None`: not published.
    pub renewals: Option<watch::Sender<Option<Instant>>>,
}

impl<K: Kv> PresenceKeeper<K> {
    fn saved_lease(&self) -> Option<LeaseId> {
        let text = std::fs::read_to_string(&self.lease_file).ok()?;
        text.trim().parse().ok().map(LeaseId)
    }

    fn save_lease(&self, lease: LeaseId) {
        if let Some(dir) = self.lease_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // 0600: the lease ID is a credential of sorts (etcd lets any user keep a lease alive).
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&self.lease_file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, lease.0.to_string().as_bytes()));
        if let Err(e) = written {
            warn!(path = %self.lease_file.display(), error = %e, "could not save lease id; a restart will wait for the old lease to expire");
        }
    }

    /// Publishes the fence's deadline, `ttl` after `from`: after a renewal or registration
    /// sent at `from` when `live`, else after a request etcd did not answer.
    fn push_fence(&self, from: Instant, live: bool) {
        if let Some(fence) = &self.fence {
            let now = Instant::now();
            let push = if live {
                Deadline::renewed
            } else {
                Deadline::moved
            };
            fence.send_modify(|d| *d = Some(push(*d, from + self.ttl, now)));
        }
    }

    /// Publishes a success: the fence moves to `sent` plus the TTL, and the peers that ask
    /// hear that this machine reached etcd at `sent`.
    fn renewed(&self, sent: Instant) {
        self.push_fence(sent, true);
        if let Some(renewals) = &self.renewals {
            renewals.send_replace(Some(sent));
        }
    }

    /// After a failed renewal or registration, in a run of failures that began with a request
    /// sent at `since`; `renewed`: the send time of the last success, if this run has one.
    /// An etcd that refused this machine's credentials (revoked, wrong, not permitted) will
    /// let the lease expire while the engine moves the units: the deadline stays where the
    /// last success put it. An etcd that does not answer is an outage unless a peer reaches
    /// it ([`Witnesses`]): then this machine is cut off alone and the deadline goes back to
    /// `renewed` plus the TTL; else it moves on (an outage must stop nothing).
    async fn after_failure(
        &self,
        error: &RegistryError,
        since: Instant,
        renewed: Option<Instant>,
        run: &mut FailureRun,
    ) {
        let refused = matches!(
            error,
            RegistryError::Kv {
                cause: KvError::AuthFailed { .. }
                    | KvError::PermissionDenied { .. }
                    | KvError::Config(_),
                ..
            }
        );
        if refused {
            if self.fence.is_some() {
                warn!(error = %error, "etcd refused this machine: its fence is not pushed forward and will stop its non-global units unless a renewal succeeds first");
            }
            return;
        }
        let evidence = match (&self.fence, &self.witnesses) {
            (Some(_), Some(witnesses)) => Some(witnesses.ask(since.elapsed()).await),
            _ => None,
        };
        match evidence {
            Some(evidence @ Evidence::CutOff { .. }) => {
                if let Some(renewed) = renewed {
                    self.pull_fence(renewed);
                }
                if !run.cut_off {
                    let deadline = self.fence.as_ref().and_then(|f| *f.borrow());
                    warn!(evidence = %evidence, deadline = ?deadline.map(|d| d.at.saturating_duration_since(Instant::now())), "this machine is cut off from etcd while others reach it: its fence will stop its non-global units at the lease's end unless a renewal succeeds first");
                }
                run.cut_off = true;
            }
            other => {
                if run.cut_off {
                    info!(evidence = ?other.map(|e| e.to_string()), "no peer reaches etcd now: the fence moves on again");
                }
                run.cut_off = false;
                self.push_fence(Instant::now(), false);
            }
        }
    }

    /// Puts the fence's deadline back at `renewed` plus the TTL, taking back the pushes made
    /// while etcd did not answer (the lease cannot outlive that instant).
    fn pull_fence(&self, renewed: Instant) {
        if let Some(fence) = &self.fence {
            let now = Instant::now();
            let at = renewed + self.ttl;
            fence.send_if_modified(|d| {
                let later = d.is_none_or(|d| d.at > at);
                if later {
                    *d = Some(Deadline::moved(*d, at, now));
                }
                later
            });
        }
    }

    /// The send time of the registration that just succeeded, as its fence deadline says
    /// (now, without a fence): the instant the lease was granted no earlier than.
    fn registered_at(&self) -> Instant {
        let now = Instant::now();
        self.fence
            .as_ref()
            .and_then(|f| f.borrow().map(|d| d.at.checked_sub(self.ttl)))
            .flatten()
            .map_or(now, |at| at.min(now))
    }

    /// The span of everything the keeper does: its logs name the machine, however many
    /// machines one process keeps (the bench).
    fn span(&self) -> Span {
        info_span!("presence", machine = %self.info.id)
    }

    /// Registers, retrying while etcd is unreachable. A duplicate machine ID is fatal
    /// ([`RegistryError::DuplicateMachine`], the only error returned).
    pub async fn register(&self) -> Result<Presence, RegistryError> {
        self.registering().instrument(self.span()).await
    }

    async fn registering(&self) -> Result<Presence, RegistryError> {
        // Jittered: after an outage that cost every machine its lease, they must not all
        // register again at the same instants.
        // At most a third of the TTL between attempts: each failed attempt for want of etcd
        // pushes the fence forward, and must come before the deadline pushed last.
        let cap = (self.ttl / 3).clamp(Duration::from_millis(200), Duration::from_secs(5));
        let mut backoff = Backoff::new(Duration::from_millis(200), cap);
        let mut run = FailureRun::default();
        loop {
            let sent = Instant::now();
            match self
                .registry
                .register(&self.info, self.ttl, self.saved_lease())
                .await
            {
                Ok(p) => {
                    self.renewed(sent);
                    self.save_lease(p.lease());
                    info!(machine = %self.info.id, lease = p.lease().0, resumed = p.resumed(), "machine registered");
                    return Ok(p);
                }
                Err(e @ RegistryError::DuplicateMachine(_)) => return Err(e),
                Err(e) => {
                    let since = *run.since.get_or_insert(sent);
                    self.after_failure(&e, since, None, &mut run).await;
                    let delay = backoff.next_delay();
                    warn!(error = %e, retry_in = ?delay, "registering machine failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Keeps `presence` alive until shutdown, publishing every new presence on `tx`, and the
    /// same one again at the first failed renewal of a run of failures (the lease in doubt).
    /// It returns an error only when registering again finds the machine ID taken.
    pub async fn keep(
        self,
        presence: Presence,
        tx: watch::Sender<Option<Presence>>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), RegistryError> {
        let span = self.span();
        self.keeping(presence, tx, shutdown).instrument(span).await
    }

    async fn keeping(
        self,
        mut presence: Presence,
        tx: watch::Sender<Option<Presence>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), RegistryError> {
        // The start of the last successful keep-alive (or registration): etcd renewed the
        // lease no earlier.
        let mut renewed = self.registered_at();
        let mut failures = 0u32;
        let mut run = FailureRun::default();
        loop {
            let delay = next_renewal(self.ttl, failures > 0, renewed.elapsed());
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
            let sent = Instant::now();
            let within = renewal_window(self.ttl, sent - renewed);
            // A renewal may wait a third of the TTL: a shutdown must not wait for it.
            let renewal = tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                r = self.registry.keep_alive_within(&presence, within) => r,
            };
            match renewal {
                Ok(()) => {
                    self.renewed(sent);
                    run = FailureRun::default();
                    if failures > 0 {
                        info!(failures, since_renewal = ?sent - renewed, "machine lease refreshed again");
                    }
                    renewed = sent;
                    failures = 0;
                }
                Err(RegistryError::Kv {
                    cause: KvError::LeaseNotFound(_),
                    ..
                }) => {
                    warn!("machine lease expired; registering again");
                    presence = self.registering().await?;
                    renewed = self.registered_at();
                    failures = 0;
                    run = FailureRun::default();
                    let _ = tx.send(Some(presence));
                }
                Err(e) => {
                    let since = *run.since.get_or_insert(sent);
                    self.after_failure(&e, since, Some(renewed), &mut run).await;
                    failures += 1;
                    if failures == 1 {
                        // Not a new lease, but news: see the module doc.
                        tx.send_modify(|_| {});
                    }
                    warn!(
                        error = %e,
                        failures,
                        since_renewal = ?renewed.elapsed(),
                        retry_in = ?next_renewal(self.ttl, true, renewed.elapsed()),
                        "refreshing machine lease failed"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
