use super::*;
use fleet_api::{Api, Listener};
use fleet_core::MachineInfo;
use fleet_registry::Registry;
use fleet_registry::kv::MemKv;
use fleet_testing::TestCerts;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn machine(id: &str, api: &str) -> MachineInfo {
    MachineInfo {
        id: id.parse().unwrap(),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: true,
        api: api.to_owned(),
        fence_at: None,
    }
}

/// A machine that last reached etcd `ago` before it is asked.
#[derive(Debug)]
struct ReachedAgo(Option<Duration>);

impl Reach for ReachedAgo {
    fn reached_within(&self, within: Duration) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        let reached = self.0.is_some_and(|ago| ago <= within);
        Box::pin(async move { reached })
    }
}

/// Machine `id`'s API with a health route, on 127.0.0.1 (TLS with `certs`); its address.
async fn serve(id: &str, reach: ReachedAgo, certs: Option<&TestCerts>) -> SocketAddr {
    let api = Api::new(Registry::new(MemKv::new(), "/t/"), 100, "0").with_health(
        fleet_api::health::Health {
            machine: id.to_owned(),
            reach: Arc::new(reach),
        },
    );
    let listener = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = match certs {
        Some(certs) => Listener::Tls(listener, crate::api::tls::acceptor(&files(certs)).unwrap()),
        None => Listener::Tcp(listener),
    };
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        fleet_api::serve(listener, fleet_api::router(api), shutdown).await;
        drop(stop);
    });
    addr
}

fn files(certs: &TestCerts) -> crate::config::ApiTlsFiles {
    crate::config::ApiTlsFiles {
        ca: certs.ca(),
        cert: certs.server_cert(),
        key: certs.server_key(),
        crl: None,
    }
}

#[tokio::test]
async fn a_peer_that_reached_etcd_in_the_time_asked_says_this_machine_is_cut_off() {
    let m2 = serve("m2", ReachedAgo(Some(Duration::from_millis(300))), None).await;
    let m3 = serve("m3", ReachedAgo(None), None).await;
    let w = PeerWitnesses::new("m1".into(), None);
    w.set_peers(vec![
        machine("m1", "http://127.0.0.1:1"),
        machine("m2", &format!("http://{m2}")),
        machine("m3", &format!("http://{m3}")),
    ]);
    assert_eq!(
        w.ask(Duration::from_secs(1)).await,
        Evidence::CutOff { by: "m2".into() }
    );
    assert_eq!(
        w.ask(Duration::from_millis(200)).await,
        Evidence::NoneReached {
            asked: 2,
            answered: 2
        }
    );
}

#[tokio::test]
async fn a_peer_that_is_gone_or_never_answers_is_no_evidence_and_costs_a_bounded_time() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    let closed = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let w = PeerWitnesses::new("m1".into(), None);
    w.set_peers(vec![
        machine("m2", &format!("http://{silent_addr}")),
        machine("m3", &format!("http://{closed_addr}")),
        // Without TLS files, an https peer cannot be asked and is not listed.
        machine("m4", "https://127.0.0.1:1"),
    ]);
    let started = Instant::now();
    let evidence = w.ask(Duration::from_secs(1)).await;
    assert_eq!(
        evidence,
        Evidence::NoneReached {
            asked: 2,
            answered: 0
        }
    );
    assert!(started.elapsed() < ASK_TIMEOUT + Duration::from_millis(500));
}

#[tokio::test]
async fn peers_are_asked_over_tls_with_this_fleetds_own_certificate() {
    let certs = TestCerts::generate(&[LOCALHOST]);
    let m2 = serve("m2", ReachedAgo(Some(Duration::ZERO)), Some(&certs)).await;
    let tls = crate::api::tls::connector(&files(&certs)).unwrap();
    let w = PeerWitnesses::new("m1".into(), Some(tls));
    w.set_peers(vec![machine("m2", &format!("https://{m2}"))]);
    assert_eq!(
        w.ask(Duration::from_secs(1)).await,
        Evidence::CutOff { by: "m2".into() }
    );
}

#[tokio::test]
async fn no_peers_at_all_is_an_outage_as_far_as_anyone_can_tell() {
    let w = PeerWitnesses::new("m1".into(), None);
    w.set_peers(vec![machine("m1", "http://127.0.0.1:1")]);
    assert_eq!(
        w.ask(Duration::from_secs(1)).await,
        Evidence::NoneReached {
            asked: 0,
            answered: 0
        }
    );
}

/// This machine's answer: its last renewal if recent enough, else one probe of etcd, shared
/// by the questions that come while it runs, and a failed probe answers "no" for a moment.
#[tokio::test]
async fn a_machine_answers_from_its_last_renewal_or_one_probe_of_its_lease() {
    let registry = Registry::new(MemKv::new(), "/t/");
    let role = MachineRole::new(registry.clone(), "m1".parse().unwrap());
    let presence = role
        .register(&machine("m1", ""), Duration::from_secs(3), None)
        .await
        .unwrap();
    let (renewals, renewals_rx) = watch::channel(None);
    let (presence_tx, presence_rx) = watch::channel(None);
    let reach = LeaseReach::new(renewals_rx, presence_rx, role.clone());
    // Not registered yet: nothing to probe.
    assert!(!reach.reached(Duration::from_secs(1)).await);
    presence_tx.send_replace(Some(presence));
    renewals.send_replace(Some(Instant::now()));
    assert!(reach.reached(Duration::from_secs(1)).await);
    renewals.send_replace(Instant::now().checked_sub(Duration::from_secs(2)));
    // The renewal is too old; the probe renews the live lease.
    assert!(reach.reached(Duration::from_secs(1)).await);
    role.unregister(&presence).await.unwrap();
    let fresh = LeaseReach::new(renewals.subscribe(), presence_tx.subscribe(), role);
    assert!(!fresh.reached(Duration::from_millis(100)).await);
    assert!(!fresh.reached(Duration::from_millis(100)).await);
}

/// Registers machine `id` with API address `api` in `registry`.
async fn register(registry: &Registry<MemKv>, id: &str, api: &str) -> Presence {
    MachineRole::new(registry.clone(), id.parse().unwrap())
        .register(&machine(id, api), Duration::from_secs(30), None)
        .await
        .unwrap()
}

/// Waits (in paused time) until `w` knows `n` peers; how long that took.
async fn until_known(w: &PeerWitnesses, n: usize) -> Duration {
    let start = Instant::now();
    while w.askable() != n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

/// The fourth CI run of stop 46: the first machine up read the presences before its peers
/// had registered, and knew none of them for 16 s; cut off then, it kept its units.
#[tokio::test(start_paused = true)]
async fn a_machine_up_before_its_peers_learns_of_each_as_it_registers() {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/t/");
    register(&registry, "m1", "http://127.0.0.1:1").await;
    let w = PeerWitnesses::new("m1".into(), None);
    let mut tasks = tokio::task::JoinSet::new();
    let (_stop, shutdown) = watch::channel(false);
    let role = MachineRole::new(registry.clone(), "m1".parse().unwrap());
    w.spawn_refresh(&mut tasks, role, shutdown);
    assert!(until_known(&w, 0).await < Duration::from_millis(100));
    register(&registry, "m2", "http://127.0.0.1:2").await;
    assert!(until_known(&w, 1).await < Duration::from_millis(100));
    // A machine without an API address cannot be asked.
    register(&registry, "m3", "").await;
    let m4 = register(&registry, "m4", "http://127.0.0.1:4").await;
    assert!(until_known(&w, 2).await < Duration::from_millis(100));
    MachineRole::new(registry.clone(), "m4".parse().unwrap())
        .unregister(&m4)
        .await
        .unwrap();
    assert!(until_known(&w, 1).await < Duration::from_millis(100));
}

/// A big cluster: once enough peers are known to ask, nothing follows each registration
/// (5,000 machines each following every other's would be 25 million watch events at a cold
/// start); the periodic read keeps the list current.
#[tokio::test(start_paused = true)]
async fn a_machine_stops_following_registrations_once_it_knows_enough_peers() {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/t/");
    let w = PeerWitnesses::new("m0".into(), None);
    let mut tasks = tokio::task::JoinSet::new();
    let (_stop, shutdown) = watch::channel(false);
    let role = MachineRole::new(registry.clone(), "m0".parse().unwrap());
    w.spawn_refresh(&mut tasks, role, shutdown);
    let start = Instant::now();
    while kv.watcher_count() != 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "it follows the registrations while it knows too few"
    );
    for i in 1..=MAX_ASKED {
        register(
            &registry,
            &format!("m{i}"),
            &format!("http://127.0.0.1:{i}"),
        )
        .await;
    }
    assert!(until_known(&w, MAX_ASKED).await < Duration::from_millis(100));
    while kv.watcher_count() != 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    register(&registry, "m9", "http://127.0.0.1:9").await;
    assert!(until_known(&w, MAX_ASKED + 1).await <= REFRESH + Duration::from_secs(1));
}
