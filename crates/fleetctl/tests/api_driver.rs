//! fleetctl's API driver (`HttpCluster`) against fleetd's API (fleet-api's router served on a
//! unix socket) over the in-memory registry, next to the etcd driver (`RegistryCluster`).
//!
//! Each write runs on two registries alike, once through the API and once directly, and the
//! outcomes must be equal (errors by their message, which is what fleetctl prints). Each read
//! runs on the API's registry both ways and must be equal too. So a command prints the same
//! bytes over either driver.

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_ops::{
    Changes, Cluster, PutRequest, RegistryCluster, ReplaceHow, StateChange, StateFilter,
};
use fleet_registry::kv::{MemKv, TlsFiles};
use fleet_registry::{MetadataChange, Registry, ScheduleEntry};
use fleet_testing::machine_running;
use fleetctl::driver::HttpCluster;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

const PREFIX: &str = "/api-driver/";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn file(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap()
}

fn service(exec: &str) -> UnitFile {
    file(&format!("[Service]\nExecStart={exec}\n"))
}

fn global(exec: &str) -> UnitFile {
    file(&format!(
        "[Service]\nExecStart={exec}\n\n[X-Fleet]\nGlobal=true\n"
    ))
}

fn put(n: &str, f: Option<UnitFile>, desired: Option<DesiredState>) -> PutRequest {
    PutRequest {
        name: name(n),
        file: f,
        desired,
        how: ReplaceHow::default(),
    }
}

/// A result as fleetctl would print it: a value's debug form, or the error's message.
fn shown<T: Debug>(r: Result<T, fleet_ops::OpsError>) -> Result<String, String> {
    r.map(|v| format!("{v:?}")).map_err(|e| e.to_string())
}

/// What both sides did, once checked equal.
#[derive(Debug)]
struct Outcome(Result<String, String>);

impl Outcome {
    fn value(self) -> String {
        self.0.expect("a value")
    }

    fn message(self) -> String {
        self.0.expect_err("an error")
    }
}

/// Two registries kept alike: `direct` is written by `RegistryCluster`, `served` through
/// fleetd's API by `HttpCluster`.
struct Twin {
    direct: RegistryCluster<MemKv>,
    served_reg: Registry<MemKv>,
    direct_reg: Registry<MemKv>,
    /// The etcd side over the served registry: what the API's answers must equal.
    served_direct: RegistryCluster<MemKv>,
    http: HttpCluster,
    /// The same client with its default pages: states and machines in one page each.
    whole: HttpCluster,
    /// `PUT` requests the server was sent.
    puts: Arc<AtomicUsize>,
    /// `GET /fleet/v1/state` requests the server was sent.
    state_reads: Arc<AtomicUsize>,
    dir: PathBuf,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl Twin {
    async fn start(test: &str) -> Twin {
        Twin::serving(test, false).await
    }

    /// `without_creates`: the server answers fleet's 405 to `POST /units` and a 400 to
    /// `pageSize=0`, as a fleetd from before those extensions does.
    async fn serving(test: &str, without_creates: bool) -> Twin {
        let dir = std::env::temp_dir().join(format!("fleetctl-api-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("fleet.sock");
        let served_reg = Registry::new(MemKv::new(), PREFIX);
        let direct_reg = Registry::new(MemKv::new(), PREFIX);
        let mut router = fleet_api::router(fleet_api::Api::new(served_reg.clone(), 100, "test"));
        if without_creates {
            router = router.layer(axum::middleware::from_fn(refuse_posts));
        }
        let (puts, count_puts) = counting(http::Method::PUT, None);
        let (state_reads, count_state_reads) = counting(http::Method::GET, Some("/fleet/v1/state"));
        let router = count_state_reads(count_puts(router));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(fleet_api::serve(
            fleet_api::Listener::Unix(listener),
            router,
            shutdown,
        ));
        let endpoint = format!("unix://{}", socket.display());
        // Pages of 2 make every listing here span several pages.
        let whole = HttpCluster::new(&endpoint, &TlsFiles::default(), Duration::from_secs(5))
            .unwrap()
            .with_poll_interval(Duration::from_millis(10));
        let http = whole.clone().with_page_size(2);
        Twin {
            direct: RegistryCluster::new(direct_reg.clone()),
            served_direct: RegistryCluster::new(served_reg.clone()),
            served_reg,
            direct_reg,
            http,
            whole,
            puts,
            state_reads,
            dir,
            _stop: stop,
        }
    }

    /// Runs a setup step (playing an agent or the engine) on both registries.
    async fn setup<F, Fut>(&self, step: F)
    where
        F: Fn(Registry<MemKv>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        step(self.direct_reg.clone()).await;
        step(self.served_reg.clone()).await;
    }

    /// Every listing, through the API and directly, on the served registry: equal.
    async fn reads_agree(&self, names: &[&str]) {
        let h = &self.http;
        let d = &self.served_direct;
        assert_eq!(shown(h.units(None).await), shown(d.units(None).await));
        let set: BTreeSet<UnitName> = names.iter().map(|n| name(n)).collect();
        assert_eq!(
            shown(h.units(Some(&set)).await),
            shown(d.units(Some(&set)).await)
        );
        for n in &set {
            assert_eq!(shown(h.unit(n).await), shown(d.unit(n).await), "{n}");
        }
        let filters = [
            StateFilter::default(),
            StateFilter {
                machine: Some(machine("m1")),
                unit: None,
            },
            StateFilter {
                machine: None,
                unit: Some(name("a.service")),
            },
        ];
        for f in &filters {
            assert_eq!(shown(h.states(f).await), shown(d.states(f).await), "{f:?}");
            let whole = &self.whole;
            assert_eq!(
                shown(whole.states(f).await),
                shown(d.states(f).await),
                "{f:?}"
            );
        }
        assert_eq!(shown(h.machines().await), shown(d.machines().await));
        assert_eq!(
            shown(self.whole.machines().await),
            shown(d.machines().await)
        );
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The requests a layer counts: their method, and their path if given.
type Counted = (Arc<AtomicUsize>, http::Method, Option<&'static str>);

/// A layer counting the requests of `method` (to `path`, if given) the server is sent.
fn counting(
    method: http::Method,
    path: Option<&'static str>,
) -> (Arc<AtomicUsize>, impl Fn(axum::Router) -> axum::Router) {
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let layer = move |router: axum::Router| {
        let state = (counted.clone(), method.clone(), path);
        router.layer(axum::middleware::from_fn_with_state(state, count_requests))
    };
    (count, layer)
}

async fn count_requests(
    axum::extract::State((count, method, path)): axum::extract::State<Counted>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if req.method() == method && path.is_none_or(|p| req.uri().path() == p) {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    next.run(req).await
}

/// An older fleetd's answers to a `POST` of its units collection (fleet's 405), to a
/// whole listing (`pageSize=0`: 400) and to the change stream (404).
async fn refuse_posts(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if req.uri().path() == "/fleet/v1/changes" {
        let body = r#"{"error":{"code":404,"message":"not found"}}"#;
        return (http::StatusCode::NOT_FOUND, body).into_response();
    }
    if req.method() == http::Method::POST {
        let body = r#"{"error":{"code":405,"message":"only GET supported against this resource"}}"#;
        return (http::StatusCode::METHOD_NOT_ALLOWED, body).into_response();
    }
    let whole = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "pageSize=0"));
    if whole {
        let body = r#"{"error":{"code":400,"message":"pageSize must be 1 to 65535, got \"0\""}}"#;
        return (http::StatusCode::BAD_REQUEST, body).into_response();
    }
    next.run(req).await
}

/// Runs `$op` (a closure body over `c`) through both sides and asserts the same outcome.
macro_rules! same {
    ($twin:expr, |$c:ident| $op:expr) => {{
        let direct = {
            let $c = &$twin.direct;
            shown($op.await)
        };
        let http = {
            let $c = &$twin.http;
            shown($op.await)
        };
        assert_eq!(http, direct, "{}", stringify!($op));
        Outcome(http)
    }};
}

async fn runs(reg: Registry<MemKv>, id: &str, units: &[(&str, &UnitFile, bool)]) {
    let info = MachineInfo {
        id: machine(id),
        public_ip: format!("10.0.0.{}", id.len()),
        metadata: [("role".to_owned(), id.to_owned())].into(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    let units: Vec<_> = units
        .iter()
        .map(|&(u, f, up)| (name(u), f.hash(), up))
        .collect();
    machine_running(&reg, &info, Duration::from_secs(600), &units).await;
}

async fn schedule(reg: Registry<MemKv>, unit: &str, on: &str, f: &UnitFile) {
    let entry = ScheduleEntry {
        name: name(unit),
        machine: machine(on),
        hash: f.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    reg.write_schedule(&[entry], &[]).await.unwrap();
}

#[tokio::test]
async fn every_write_has_the_same_outcome_over_the_api_as_over_etcd() {
    let t = Twin::start("writes").await;
    let a = service("/bin/a");
    let out = same!(t, |c| c.put(put("a.service", Some(a.clone()), None)));
    assert!(out.value().starts_with("Created"));
    let out = same!(t, |c| c.put(put("a.service", Some(a.clone()), None)));
    assert!(out.value().starts_with("Unchanged"));
    same!(t, |c| c.put(put(
        "a.service",
        None,
        Some(DesiredState::Launched)
    )));
    for n in ["b.service", "c.service", "d@.service", "e@1.service"] {
        same!(t, |c| c.put(put(n, Some(service("/bin/x")), None)));
    }
    same!(t, |c| c.set_state(
        &name("b.service"),
        StateChange::Raise(DesiredState::Loaded)
    ));
    same!(t, |c| c.set_state(&name("b.service"), StateChange::Stop));
    same!(t, |c| c.set_state(&name("b.service"), StateChange::Unload));
    same!(t, |c| c.set_state(&name("b.service"), StateChange::Unload));
    t.reads_agree(&["a.service", "b.service", "d@.service", "zz.service"])
        .await;

    // A replace with each of --replace's options.
    let mut req = put("a.service", Some(service("/bin/a2")), None);
    req.how.no_restart = true;
    let out = same!(t, |c| c.put(req.clone()));
    assert!(out.value().starts_with("Replaced"));
    req.file = Some(service("/bin/a3"));
    req.how = ReplaceHow {
        reschedule: true,
        ..ReplaceHow::default()
    };
    same!(t, |c| c.put(req.clone()));

    let out = same!(t, |c| c.restart(&name("a.service")));
    assert_eq!(out.value(), "Generation(1)");
    same!(t, |c| c.put(put(
        "c.service",
        None,
        Some(DesiredState::Loaded)
    )));
    assert_eq!(
        same!(t, |c| c.restart(&name("c.service"))).value(),
        "Launched"
    );

    // A rolling replace of a global unit.
    same!(t, |c| c.put(put(
        "g.service",
        Some(global("/bin/old")),
        Some(DesiredState::Launched)
    )));
    let mut req = put("g.service", Some(global("/bin/new")), None);
    req.how.rolling = true;
    same!(t, |c| c.put(req.clone()));
    same!(t, |c| c.advance_rollout(
        &name("g.service"),
        &[machine("m1"), machine("m2")]
    ));
    same!(t, |c| c.finish_rollout(&name("g.service")));

    let out = same!(t, |c| c.destroy(&name("b.service")));
    assert_eq!(out.value(), "Unit");
    assert_eq!(
        same!(t, |c| c.destroy(&name("b.service"))).value(),
        "Missing"
    );
    t.reads_agree(&["a.service", "g.service", "c.service"])
        .await;
}

/// A start of many new units: `create_many` over the API (`POST /units`, up to 1,000 units
/// a request) says of each unit what the etcd side says, refusals included; a server
/// without `POST /units` gets one `PUT` per unit, with the same outcomes.
#[tokio::test]
async fn creating_many_units_has_the_same_outcomes_over_the_api_as_over_etcd() {
    for without_creates in [false, true] {
        let t = Twin::serving("create-many", without_creates).await;
        let launched = Some(DesiredState::Launched);
        same!(t, |c| c.put(put(
            "same.service",
            Some(service("/bin/t")),
            None
        )));
        same!(t, |c| c.put(put(
            "other.service",
            Some(service("/bin/o")),
            None
        )));
        let mut reqs: Vec<PutRequest> = (0..2_500)
            .map(|i| put(&format!("t@{i}.service"), Some(service("/bin/t")), launched))
            .collect();
        reqs.insert(5, put("t@.service", Some(service("/bin/t")), launched));
        reqs.insert(
            1_500,
            put("same.service", Some(service("/bin/t")), launched),
        );
        reqs.insert(
            2_000,
            put("other.service", Some(service("/bin/t")), launched),
        );
        reqs.insert(2_400, put("bare.service", None, launched));
        // A unit asked twice is created once, then found there (another request).
        reqs.insert(20, put("t@7.service", Some(service("/bin/t")), launched));
        let outcomes = |created: fleet_ops::Created| -> Vec<(String, Result<String, String>)> {
            created
                .into_iter()
                .map(|(n, res)| (n.to_string(), shown(res)))
                .collect()
        };
        let direct = outcomes(t.direct.create_many(reqs.clone()).await);
        let before = t.served_reg.snapshot().await.unwrap().revision;
        let http = outcomes(t.http.create_many(reqs.clone()).await);
        // Many units per transaction either way (fleetd groups concurrent PUTs too); one
        // request per 1,000 units, or one per unit.
        let revisions = t.served_reg.snapshot().await.unwrap().revision - before;
        assert!(revisions < 300, "{revisions}");
        let puts = t.puts.load(std::sync::atomic::Ordering::SeqCst);
        if without_creates {
            assert_eq!(puts, 2 + 2_505, "each create is a PUT of its own");
        } else {
            assert_eq!(puts, 2, "only the setup's two");
        }
        assert_eq!(http.len(), direct.len());
        for (h, d) in http.iter().zip(&direct) {
            assert_eq!(h, d, "without_creates: {without_creates}");
        }
        let failed: Vec<&str> = http
            .iter()
            .filter(|(_, res)| res.is_err())
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(
            failed,
            ["t@.service", "other.service", "bare.service"],
            "{http:?}"
        );
        t.reads_agree(&["t@0.service", "t@2499.service", "same.service"])
            .await;
    }
}

#[tokio::test]
async fn every_refusal_prints_the_same_message_over_the_api_as_over_etcd() {
    let t = Twin::start("refusals").await;
    let missing = name("missing.service");
    let e = same!(t, |c| c.set_state(&missing, StateChange::Stop));
    assert_eq!(e.message(), "Unit missing.service does not exist");
    same!(t, |c| c.restart(&missing));
    same!(t, |c| c.advance_rollout(&missing, &[machine("m1")]));
    same!(t, |c| c.put(put(
        "missing.service",
        None,
        Some(DesiredState::Launched)
    )));
    same!(t, |c| c.put(put(
        "t@.service",
        Some(service("/bin/t")),
        Some(DesiredState::Launched)
    )));
    same!(t, |c| c.put(put(
        "i.service",
        Some(service("/bin/i")),
        None
    )));
    let e = same!(t, |c| c.set_state(&name("i.service"), StateChange::Stop));
    assert_eq!(
        e.message(),
        "Unable to stop unit i.service in state inactive"
    );
    same!(t, |c| c.restart(&name("i.service")));
    same!(t, |c| c.put(put(
        "l.service",
        Some(service("/bin/l")),
        Some(DesiredState::Launched)
    )));
    let lower = put(
        "l.service",
        Some(service("/bin/l2")),
        Some(DesiredState::Loaded),
    );
    let e = same!(t, |c| c.put(lower.clone()));
    assert!(e.message().contains("can not replace"));
    let bad = file("[X-Fleet]\nMachineID=not a machine\n");
    let e = same!(t, |c| c.put(put("bad.service", Some(bad.clone()), None)));
    assert!(e.0.is_err());
    t.reads_agree(&["i.service", "l.service", "t@.service"])
        .await;
}

#[tokio::test]
async fn listings_show_placement_states_and_machines_alike_over_several_pages() {
    let t = Twin::start("listings").await;
    let a = service("/bin/a");
    let b = service("/bin/b");
    same!(t, |c| c.put(put(
        "a.service",
        Some(a.clone()),
        Some(DesiredState::Launched)
    )));
    same!(t, |c| c.put(put(
        "b.service",
        Some(b.clone()),
        Some(DesiredState::Loaded)
    )));
    same!(t, |c| c.put(put(
        "g.service",
        Some(global("/bin/g")),
        Some(DesiredState::Launched)
    )));
    let (ac, bc) = (a.clone(), b.clone());
    t.setup(move |reg| {
        let (a, b) = (ac.clone(), bc.clone());
        async move {
            runs(
                reg.clone(),
                "m1",
                &[("a.service", &a, true), ("b.service", &b, false)],
            )
            .await;
            runs(reg.clone(), "m2", &[("a.service", &a, false)]).await;
            runs(reg.clone(), "m3", &[]).await;
            schedule(reg.clone(), "a.service", "m1", &a).await;
            schedule(reg.clone(), "b.service", "m1", &b).await;
            schedule(reg.clone(), "g.service", "m2", &global("/bin/g")).await;
            schedule(reg, "g.service", "m3", &global("/bin/g")).await;
        }
    })
    .await;
    let changes = [
        MetadataChange::Set {
            machine: machine("m2"),
            key: "tier".parse().unwrap(),
            value: "api".into(),
        },
        MetadataChange::Remove {
            machine: machine("m1"),
            key: "role".parse().unwrap(),
        },
    ];
    same!(t, |c| c.change_metadata(&changes));
    t.reads_agree(&["a.service", "b.service", "g.service"])
        .await;
    let listing = t.http.machines().await.unwrap();
    assert_eq!(listing.machines.len(), 3);
    assert_eq!(listing.machines[1].metadata["tier"], "api");
    // More names than one request asks for: several requests, one listing.
    let many: BTreeSet<UnitName> = (0..1100)
        .map(|i| name(&format!("n{i:04}.service")))
        .chain([name("a.service"), name("g.service")])
        .collect();
    let listing = t.http.units(Some(&many)).await.unwrap();
    assert_eq!(
        shown(Ok(&listing)),
        shown(t.served_direct.units(Some(&many)).await)
    );
    assert_eq!(listing.units.len(), 2);
    let units = t.http.units(None).await.unwrap().units;
    assert_eq!(units[0].current, DesiredState::Launched);
    assert_eq!(units[2].status.machines, [machine("m2"), machine("m3")]);
}

#[tokio::test]
async fn a_wait_over_the_api_sees_what_a_wait_over_etcd_sees() {
    let t = Twin::start("watch").await;
    let a = service("/bin/a");
    t.http
        .put(put("a.service", Some(a.clone()), None))
        .await
        .unwrap();
    let names: BTreeSet<UnitName> = [name("a.service"), name("gone.service")].into();
    let mut changes = t.http.watch(names.clone()).await.unwrap();
    assert_eq!(changes.names(), &names);
    let direct = t.served_direct.watch(names.clone()).await.unwrap();
    assert_eq!(changes.view(), direct.view());
    t.http
        .set_state(
            &name("a.service"),
            StateChange::Raise(DesiredState::Launched),
        )
        .await
        .unwrap();
    changes.changed().await.unwrap();
    assert_eq!(
        changes.view().units[&name("a.service")].desired,
        DesiredState::Launched
    );
    schedule(t.served_reg.clone(), "a.service", "m1", &a).await;
    runs(t.served_reg.clone(), "m1", &[("a.service", &a, true)]).await;
    while !changes.view().states.contains_key(&name("a.service"))
        || changes.view().machines.is_empty()
        || changes.view().units[&name("a.service")].machines.is_empty()
    {
        changes.changed().await.unwrap();
    }
    let direct = t.served_direct.watch(names).await.unwrap();
    assert_eq!(changes.view(), direct.view());
    // More names than one request takes: read as whole listings, the same view.
    let many: BTreeSet<UnitName> = (0..600)
        .map(|i| name(&format!("n{i:03}.service")))
        .chain([name("a.service")])
        .collect();
    let http = t.http.watch(many.clone()).await.unwrap();
    let direct = t.served_direct.watch(many).await.unwrap();
    assert_eq!(http.view(), direct.view());
    assert_eq!(http.view().units.len(), 1);
}

/// A wait reads its view once, then again only after a change: a second of quiet costs no
/// read (a poll every 10 ms would have made a hundred).
#[tokio::test]
async fn a_wait_over_the_api_follows_the_change_stream_and_reads_nothing_while_quiet() {
    let t = Twin::start("stream").await;
    let a = service("/bin/a");
    t.http.put(put("a.service", Some(a), None)).await.unwrap();
    let mut changes = t.http.watch([name("a.service")].into()).await.unwrap();
    let before = t.state_reads.load(std::sync::atomic::Ordering::SeqCst);
    let quiet = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    assert!(quiet.is_err(), "nothing changed");
    let after = t.state_reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        after - before <= 1,
        "{} state reads while quiet",
        after - before
    );
    t.http
        .set_state(
            &name("a.service"),
            StateChange::Raise(DesiredState::Launched),
        )
        .await
        .unwrap();
    changes.changed().await.unwrap();
    assert_eq!(
        changes.view().units[&name("a.service")].desired,
        DesiredState::Launched
    );
}

/// Against a fleetd without the change stream (404, as an older one answers), a wait polls,
/// and sees the change all the same.
#[tokio::test]
async fn a_wait_against_a_fleetd_without_the_change_stream_polls_instead() {
    let t = Twin::serving("no-stream", true).await;
    let a = service("/bin/a");
    t.http.put(put("a.service", Some(a), None)).await.unwrap();
    let mut changes = t.http.watch([name("a.service")].into()).await.unwrap();
    let before = t.state_reads.load(std::sync::atomic::Ordering::SeqCst);
    let quiet = tokio::time::timeout(Duration::from_millis(300), changes.changed()).await;
    assert!(quiet.is_err(), "nothing changed");
    let after = t.state_reads.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        after - before >= 5,
        "only {} polls in 300 ms",
        after - before
    );
    t.http
        .set_state(
            &name("a.service"),
            StateChange::Raise(DesiredState::Launched),
        )
        .await
        .unwrap();
    changes.changed().await.unwrap();
    assert_eq!(
        changes.view().units[&name("a.service")].desired,
        DesiredState::Launched
    );
}

/// etcd, as fleetd's registry sees it, refusing every many-unit transaction.
#[derive(Clone)]
struct BatchesFail;

impl fleet_registry::kv::Hook for BatchesFail {
    async fn before(
        &self,
        request: fleet_registry::kv::Request<'_>,
    ) -> Result<(), fleet_registry::kv::KvError> {
        match request {
            fleet_registry::kv::Request::Txn(txn) if txn.compares.len() > 1 => {
                // Not a transient error: those are read back and sent again for ~15 s.
                Err(fleet_registry::kv::KvError::Refused(
                    "down for the batches".into(),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// A create of many units over the API when etcd fails fleetd's writes: each request's first
/// unit says why, its others are not written, and once a request came back so, fleetctl
/// sends no more (the etcd side starts no transaction after a failed one).
#[tokio::test]
async fn a_create_that_fleetd_fails_to_write_stops_the_requests_after_it() {
    let dir = std::env::temp_dir().join(format!("fleetctl-api-failing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("fleet.sock");
    let kv = fleet_registry::kv::Hooked {
        inner: MemKv::new(),
        hook: BatchesFail,
    };
    let (posts, count_posts) = counting(http::Method::POST, None);
    let router = count_posts(fleet_api::router(fleet_api::Api::new(
        Registry::new(kv, PREFIX),
        100,
        "test",
    )));
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(fleet_api::serve(
        fleet_api::Listener::Unix(listener),
        router,
        shutdown,
    ));
    let endpoint = format!("unix://{}", socket.display());
    let http = HttpCluster::new(&endpoint, &TlsFiles::default(), Duration::from_secs(5)).unwrap();

    let reqs: Vec<PutRequest> = (0..5_000)
        .map(|i| {
            let f = Some(service("/bin/t"));
            put(&format!("t@{i}.service"), f, Some(DesiredState::Launched))
        })
        .collect();
    let created = http.create_many(reqs).await;
    assert_eq!(created.len(), 5_000);
    // Four requests in flight, each failed by fleetd; the fifth never sent.
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 4);
    let mut refused = Vec::new();
    for (i, (name, res)) in created.iter().enumerate() {
        match res {
            Err(e) if i % 1_000 == 0 && i < 4_000 => {
                assert!(e.to_string().contains("etcd"), "{name}: {e}");
                refused.push(name.clone());
            }
            // Stopped by its own request's first unit, or (the fifth request) by the first.
            Err(fleet_ops::OpsError::NotWritten { with }) => {
                let first = if i < 4_000 { i - i % 1_000 } else { 0 };
                assert_eq!(with, &name_at(first), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(refused.len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

fn name_at(i: usize) -> UnitName {
    name(&format!("t@{i}.service"))
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_the_endpoint() {
    let dir = std::env::temp_dir().join(format!("fleetctl-api-none-{}", std::process::id()));
    let endpoint = format!("unix://{}/fleet.sock", dir.display());
    let http = HttpCluster::new(&endpoint, &TlsFiles::default(), Duration::from_secs(5)).unwrap();
    let e = http.units(None).await.unwrap_err().to_string();
    assert!(e.contains(&endpoint), "{e}");
    assert!(e.contains("does not exist"), "{e}");
    assert!(e.contains("no fleetd runs on this host"), "{e}");
}
