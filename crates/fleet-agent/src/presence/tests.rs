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
    /// How long each keep-alive was let wait for its answer.
    windows: Arc<Mutex<Vec<Option<Duration>>>>,
}

type FlakyKv = Hooked<MemKv, Flaky>;

impl Flaky {
    fn sent(&self) -> Vec<Duration> {
        self.sent.lock().unwrap().clone()
    }
}

impl Hook for Flaky {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::KeepAlive { within, .. } = request {
            let at = self.start.elapsed();
            self.sent.lock().unwrap().push(at);
            self.windows.lock().unwrap().push(within);
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
    shutdown: watch::Sender<bool>,
    keeper: tokio::task::JoinHandle<Result<(), RegistryError>>,
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
            windows: Arc::default(),
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
    let keeper = tokio::spawn(keeper.keep(first, tx, shutdown_rx));
    World {
        kv,
        registry,
        first,
        presence,
        fence,
        renewals,
        witnesses,
        lease_file,
        shutdown,
        keeper,
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
                windows: Arc::default(),
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
async fn each_keep_alive_is_let_wait_what_is_left_of_its_window() {
    // Sent at 1 s and failing at 1.1 s, again at 1.35 s: the second may wait 650 ms, until
    // two thirds of the TTL after the registration. It succeeds, and the third, a third of
    // the TTL later, has a whole third again.
    let w = keep_with(ms(500)..ms(1200), ms(100)).await;
    tokio::time::sleep(ms(2500)).await;

    assert_eq!(w.kv.hook.sent()[..3], [1000, 1350, 2350].map(ms));
    let windows = w.kv.hook.windows.lock().unwrap().clone();
    assert_eq!(
        windows[..3],
        [Some(ms(1000)), Some(ms(650)), Some(ms(1000))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_does_not_wait_for_a_renewal_etcd_holds() {
    // The keep-alive sent at 1 s is held 5 s; the shutdown comes at 1.5 s.
    let mut w = keep_with(ms(500)..ms(1500), ms(5000)).await;
    tokio::time::sleep(ms(1500)).await;
    let asked = Instant::now();
    w.shutdown.send(true).unwrap();
    (&mut w.keeper).await.unwrap().unwrap();
    assert_eq!(asked.elapsed(), Duration::ZERO);
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
