//! This machine's presence in the registry: registered on a lease, kept alive at TTL/3 (every
//! [`RETRY`] after a failure, while the lease may still be alive), and registered again (a new
//! lease, all states republished) if the lease ever expires, e.g. after etcd was unreachable
//! for longer than the TTL.
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
use fleet_registry::kv::{Kv, KvError, LeaseId};
use fleet_registry::{MachineRole, Presence, RegistryError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, Span, info, info_span, warn};

/// The pause before retrying a failed keep-alive. Waiting the regular TTL/3 instead cost a
/// machine its lease: with a 3 s TTL, one renewal that etcd 3.4 held for 1 s under a write
/// burst left no time for another, and the engine unscheduled all 1,000 units of the machine
/// (docs/benchmarks.md, item 6).
const RETRY: Duration = Duration::from_millis(250);

/// How long to wait before the next keep-alive, `since_renewal` after the start of the last
/// one that succeeded (or of the registration). After a success: TTL/3. After a failure:
/// [`RETRY`] while the lease may still be alive, then TTL/3 again, since the lease is gone
/// unless etcd itself is down (it renews every lease when it recovers, or answers
/// `LeaseNotFound` and we register again), and hammering it would not help.
fn next_keep_alive(ttl: Duration, last_failed: bool, since_renewal: Duration) -> Duration {
    let period = ttl / 3;
    if last_failed && since_renewal < ttl {
        RETRY.min(period)
    } else {
        period
    }
}

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

    /// Publishes the fence's deadline, `ttl` after `from`.
    fn push_fence(&self, from: Instant) {
        if let Some(fence) = &self.fence {
            let now = Instant::now();
            fence.send_modify(|d| *d = Some(Deadline::pushed(*d, from + self.ttl, now)));
        }
    }

    /// Publishes a success: the fence moves to `sent` plus the TTL, and the peers that ask
    /// hear that this machine reached etcd at `sent`.
    fn renewed(&self, sent: Instant) {
        self.push_fence(sent);
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
                self.push_fence(Instant::now());
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
                    *d = Some(Deadline::pushed(*d, at, now));
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
            let delay = next_keep_alive(self.ttl, failures > 0, renewed.elapsed());
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
            let sent = Instant::now();
            match self.registry.keep_alive(&presence).await {
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
                        retry_in = ?next_keep_alive(self.ttl, true, renewed.elapsed()),
                        "refreshing machine lease failed"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::witness::Fixed;
    use fleet_registry::Registry;
    use fleet_registry::kv::{Hook, Hooked, MemKv, Request};
    use std::sync::Mutex;

    const TTL: Duration = Duration::from_secs(3);

    /// A [`MemKv`] whose keep-alives fail while the clock is inside `failing` (offsets from
    /// `start`), each taking `latency` first, as a renewal etcd holds until its client's
    /// deadline. It records when every keep-alive was sent.
    #[derive(Debug, Clone)]
    struct Flaky {
        start: Instant,
        failing: std::ops::Range<Duration>,
        latency: Duration,
        /// Fail as etcd's RBAC refusing, not as a timeout.
        refuse: bool,
        sent: Arc<Mutex<Vec<Duration>>>,
    }

    type FlakyKv = Hooked<MemKv, Flaky>;

    impl Flaky {
        fn sent(&self) -> Vec<Duration> {
            self.sent.lock().unwrap().clone()
        }
    }

    impl Hook for Flaky {
        async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
            if let Request::KeepAlive(_) = request {
                let at = self.start.elapsed();
                self.sent.lock().unwrap().push(at);
                if self.failing.contains(&at) {
                    tokio::time::sleep(self.latency).await;
                    if self.refuse {
                        return Err(KvError::PermissionDenied {
                            user: "fleet-host-m1".to_owned(),
                            what: "renew a lease".to_owned(),
                        });
                    }
                    return Err(KvError::Timeout(self.latency, "memory".to_owned()));
                }
            }
            Ok(())
        }
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    struct World {
        kv: FlakyKv,
        registry: Registry<FlakyKv>,
        first: Presence,
        presence: watch::Receiver<Option<Presence>>,
        fence: watch::Receiver<Option<Deadline>>,
        renewals: watch::Receiver<Option<Instant>>,
        witnesses: Fixed,
        lease_file: std::path::PathBuf,
        _shutdown: watch::Sender<bool>,
    }

    impl Drop for World {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.lease_file);
        }
    }

    /// Registers machine m1 on a [`TTL`] lease at time 0 and keeps it alive in the background.
    async fn keep_with(failing: std::ops::Range<Duration>, latency: Duration) -> World {
        keep_failing(failing, latency, false).await
    }

    async fn keep_failing(
        failing: std::ops::Range<Duration>,
        latency: Duration,
        refuse: bool,
    ) -> World {
        let kv = FlakyKv {
            inner: MemKv::new(),
            hook: Flaky {
                start: Instant::now(),
                failing,
                latency,
                refuse,
                sent: Arc::default(),
            },
        };
        let registry = Registry::new(kv.clone(), "/t/");
        let lease_file = std::env::temp_dir().join(format!(
            "fleet-agent-presence-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&lease_file);
        let (fence_tx, fence) = watch::channel(None);
        let (renewals_tx, renewals) = watch::channel(None);
        let witnesses = Fixed::new(Evidence::NoneReached {
            asked: 2,
            answered: 0,
        });
        let keeper = PresenceKeeper {
            registry: MachineRole::new(registry.clone(), "m1".parse().unwrap()),
            info: MachineInfo {
                id: "m1".parse().unwrap(),
                public_ip: String::new(),
                metadata: Default::default(),
                version: "test".into(),
                disable_engine: true,
                api: String::new(),
                fence_at: None,
            },
            ttl: TTL,
            lease_file: lease_file.clone(),
            fence: Some(fence_tx),
            witnesses: Some(Arc::new(witnesses.clone())),
            renewals: Some(renewals_tx),
        };
        let first = keeper.register().await.unwrap();
        let (tx, presence) = watch::channel(Some(first));
        let (shutdown, shutdown_rx) = watch::channel(false);
        tokio::spawn(keeper.keep(first, tx, shutdown_rx));
        World {
            kv,
            registry,
            first,
            presence,
            fence,
            renewals,
            witnesses,
            lease_file,
            _shutdown: shutdown,
        }
    }

    impl World {
        /// The lease m1's record hangs on, if it is registered.
        async fn machine_lease(&self) -> Option<i64> {
            let key = self.registry.keys().machine(&"m1".parse().unwrap());
            let res = self.kv.range(&key, false, None).await.unwrap();
            res.kvs.first().map(|kv| kv.lease)
        }
    }

    #[test]
    fn waits_a_third_of_the_ttl_after_a_success_and_retries_quickly_after_a_failure() {
        assert_eq!(next_keep_alive(TTL, false, ms(100)), ms(1000));
        assert_eq!(next_keep_alive(TTL, true, ms(2000)), RETRY);
        // Past the TTL the lease is gone unless etcd is down: back to the regular pace.
        assert_eq!(next_keep_alive(TTL, true, ms(3000)), ms(1000));
        // A TTL so short that TTL/3 is below the retry pause keeps TTL/3.
        assert_eq!(next_keep_alive(ms(600), true, ms(100)), ms(200));
    }

    #[tokio::test(start_paused = true)]
    async fn pushes_the_fence_to_a_renewals_send_time_plus_the_ttl_and_on_while_etcd_fails() {
        let start = Instant::now();
        // The keep-alive sent at 1 s is held 1 s and times out; the one at 2.25 s succeeds.
        let w = keep_with(ms(500)..ms(1500), ms(1000)).await;
        let deadline = || w.fence.borrow().map(|d| d.at - start);
        assert_eq!(deadline(), Some(TTL), "registered at 0");
        tokio::time::sleep(ms(2100)).await;
        assert_eq!(
            deadline(),
            Some(ms(2000) + TTL),
            "alive while etcd failed at 2 s"
        );
        tokio::time::sleep(ms(300)).await;
        assert_eq!(deadline(), Some(ms(2250) + TTL), "renewal sent at 2.25 s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_etcd_refuses_leaves_the_fence_where_the_last_success_put_it() {
        let start = Instant::now();
        let w = keep_failing(ms(500)..ms(60_000), ms(10), true).await;
        tokio::time::sleep(ms(2500)).await;
        assert_eq!(w.fence.borrow().map(|d| d.at - start), Some(TTL));
    }

    /// Issue 36: a machine whose peers reach etcd while it cannot is cut off alone; its
    /// fence goes back to the last renewal plus the TTL, and moves on again once a renewal
    /// succeeds.
    #[tokio::test(start_paused = true)]
    async fn a_machine_cut_off_alone_takes_back_its_fence_to_the_lease_end() {
        let start = Instant::now();
        // Renewed at 1 s; from 1.5 s every keep-alive fails after 1 s (until 6 s).
        let w = keep_with(ms(1500)..ms(6000), ms(1000)).await;
        let deadline = || w.fence.borrow().map(|d| d.at - start);
        tokio::time::sleep(ms(3100)).await;
        assert_eq!(
            deadline(),
            Some(ms(3000) + TTL),
            "an outage, as far as it knows"
        );
        assert_eq!(*w.renewals.borrow(), Some(start + ms(1000)));
        w.witnesses.set(Evidence::CutOff { by: "m2".into() });
        tokio::time::sleep(ms(1500)).await;
        assert_eq!(
            deadline(),
            Some(ms(1000) + TTL),
            "the lease's end, no later"
        );
        w.witnesses.set(Evidence::NoneReached {
            asked: 2,
            answered: 2,
        });
        // Past the TTL, the next keep-alive goes at 5.25 s and fails at 6.25 s.
        tokio::time::sleep(ms(2000)).await;
        assert_eq!(deadline(), Some(ms(6250) + TTL), "an outage again");
    }

    #[tokio::test(start_paused = true)]
    async fn peers_are_asked_about_the_time_since_the_first_failure_only() {
        #[derive(Debug, Default)]
        struct Recorder(Mutex<Vec<Duration>>);
        impl Witnesses for Recorder {
            fn ask(&self, within: Duration) -> crate::witness::Asked<'_> {
                self.0.lock().unwrap().push(within);
                Box::pin(async {
                    Evidence::NoneReached {
                        asked: 0,
                        answered: 0,
                    }
                })
            }
        }
        let registry = Registry::new(
            Hooked {
                inner: MemKv::new(),
                hook: Flaky {
                    start: Instant::now(),
                    failing: ms(500)..ms(60_000),
                    latency: ms(1000),
                    refuse: false,
                    sent: Arc::default(),
                },
            },
            "/t/",
        );
        let recorder = Arc::new(Recorder::default());
        let (fence_tx, _fence) = watch::channel(None);
        let keeper = PresenceKeeper {
            registry: MachineRole::new(registry, "m1".parse().unwrap()),
            info: MachineInfo {
                id: "m1".parse().unwrap(),
                public_ip: String::new(),
                metadata: Default::default(),
                version: "test".into(),
                disable_engine: true,
                api: String::new(),
                fence_at: None,
            },
            ttl: TTL,
            lease_file: std::env::temp_dir()
                .join(format!("fleet-agent-presence-asked-{}", std::process::id())),
            fence: Some(fence_tx),
            witnesses: Some(recorder.clone()),
            renewals: None,
        };
        let first = keeper.register().await.unwrap();
        let (tx, _rx) = watch::channel(Some(first));
        let (_shutdown, shutdown_rx) = watch::channel(false);
        tokio::spawn(keeper.keep(first, tx, shutdown_rx));
        // Keep-alives sent at 1 s (fails at 2 s) and 2.25 s (fails at 3.25 s).
        tokio::time::sleep(ms(3500)).await;
        assert_eq!(*recorder.0.lock().unwrap(), [ms(1000), ms(2250)]);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_a_slow_failed_keep_alive_after_a_quarter_second() {
        // The keep-alive sent at 1 s is held 1 s and times out, as etcd 3.4 under a burst.
        let w = keep_with(ms(500)..ms(1500), ms(1000)).await;
        tokio::time::sleep(ms(3500)).await;

        assert_eq!(w.kv.hook.sent(), [ms(1000), ms(2250), ms(3250)]);
        assert_eq!(w.machine_lease().await, Some(w.first.lease().0));
        assert_eq!(*w.presence.borrow(), Some(w.first));
    }

    #[tokio::test(start_paused = true)]
    async fn keeps_the_lease_through_failures_that_last_most_of_the_ttl() {
        // Every keep-alive sent in [0.5 s, 2.5 s) fails after 100 ms. Waiting TTL/3 after
        // each failure would send the next one at 3.2 s, after the lease expired at 3 s.
        let w = keep_with(ms(500)..ms(2500), ms(100)).await;
        tokio::time::sleep(ms(6000)).await;

        let sent = w.kv.hook.sent();
        assert_eq!(
            sent[..7],
            [1000, 1350, 1700, 2050, 2400, 2750, 3750].map(ms)
        );
        assert_eq!(w.machine_lease().await, Some(w.first.lease().0));
        assert_eq!(*w.presence.borrow(), Some(w.first));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_failed_renewal_of_a_run_is_news_on_the_presence_channel() {
        // Renewals sent from 0.5 s to 2.5 s fail after 100 ms: one run of failures, announced
        // once, with the same lease.
        let mut w = keep_with(ms(500)..ms(2500), ms(100)).await;
        tokio::time::sleep(ms(900)).await;
        assert!(
            !w.presence.has_changed().unwrap(),
            "no news while renewals succeed"
        );
        tokio::time::sleep(ms(300)).await;
        assert!(
            w.presence.has_changed().unwrap(),
            "the failure at 1.1 s is news"
        );
        assert_eq!(*w.presence.borrow_and_update(), Some(w.first));
        tokio::time::sleep(ms(4000)).await;
        assert!(
            !w.presence.has_changed().unwrap(),
            "the later failures of the same run and the recovery are not"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn registers_again_once_the_lease_is_lost() {
        let w = keep_with(ms(500)..ms(5000), ms(100)).await;
        tokio::time::sleep(ms(8000)).await;

        // Quick retries only while the lease could still be alive (until 3 s after the renewal
        // at 0 s), the regular pace after that; at 5.3 s etcd answers again, the lease is
        // gone, and registering tries the saved lease once more before granting a new one.
        assert_eq!(
            w.kv.hook.sent(),
            [
                1000, 1350, 1700, 2050, 2400, 2750, 3100, 4200, 5300, 5300, 6300, 7300
            ]
            .map(ms)
        );
        let now = *w.presence.borrow();
        let now = now.expect("a presence");
        assert_ne!(now.lease(), w.first.lease());
        assert_eq!(w.machine_lease().await, Some(now.lease().0));
    }

    /// Issue 17: registering, keeping the lease, resuming it after a restart and revoking it
    /// need nothing beyond the machine's own etcd role.
    #[tokio::test(start_paused = true)]
    async fn the_presence_keeper_needs_nothing_beyond_its_machine_role() {
        let m1: fleet_core::MachineId = "m1".parse().unwrap();
        let kv = MemKv::new();
        let keys = fleet_registry::Keys::new("/t/");
        let role = fleet_registry::rbac::machine(&keys, &m1);
        let host = fleet_registry::kv::Rbac::new(kv.clone(), "fleet-host-m1", vec![role]);
        let lease_file = std::env::temp_dir().join(format!(
            "fleet-agent-presence-rbac-test-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&lease_file);
        let keeper = || PresenceKeeper {
            registry: MachineRole::new(Registry::new(host.clone(), "/t/"), m1.clone()),
            info: MachineInfo {
                id: m1.clone(),
                public_ip: String::new(),
                metadata: Default::default(),
                version: "test".into(),
                disable_engine: true,
                api: String::new(),
                fence_at: None,
            },
            ttl: TTL,
            lease_file: lease_file.clone(),
            fence: None,
            witnesses: None,
            renewals: None,
        };
        let first = keeper().register().await.unwrap();
        let (tx, _rx) = watch::channel(Some(first));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let kept = tokio::spawn(keeper().keep(first, tx, shutdown_rx));
        tokio::time::sleep(TTL * 5).await;
        shutdown.send(true).unwrap();
        kept.await.unwrap().unwrap();
        let again = keeper().register().await.unwrap();
        assert!(
            again.resumed(),
            "the saved lease was kept alive and resumed"
        );
        keeper().registry.unregister(&again).await.unwrap();
        let left = kv.range("/t/", true, None).await.unwrap();
        assert!(left.kvs.is_empty(), "gone with the lease");
        let _ = std::fs::remove_file(&lease_file);
    }
}
