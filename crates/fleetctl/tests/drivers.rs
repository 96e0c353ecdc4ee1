//! The fleetctl binary over both drivers against one etcd: the API driver through fleet-api's
//! router (served here on a unix socket, and on TLS with client certificates, as fleetd
//! serves it), the etcd driver directly, each on its own key prefix. The same commands must
//! print the same bytes and exit alike.

use fleet_registry::Registry;
use fleet_testing::{TestCerts, TestEtcd};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};

const ETCD_PREFIX: &str = "/drivers-etcd/";
const API_PREFIX: &str = "/drivers-api/";

struct Env {
    etcd: TestEtcd,
    dir: PathBuf,
    socket: PathBuf,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl Env {
    async fn start(test: &str) -> Env {
        let etcd = TestEtcd::start().await;
        let dir =
            std::env::temp_dir().join(format!("fleetctl-drivers-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("fleet.sock");
        let registry = Registry::new(etcd.kv().await, API_PREFIX);
        let events = fleet_registry::UnitsRole::new(registry.clone())
            .event_log(
                fleet_registry::EventConfig::default(),
                fleet_registry::EventStats::default(),
            )
            .into_sink();
        let router = fleet_api::router(
            // As fleetd serves it: unit listings from its held view, users' writes recorded.
            fleet_api::Api::new(registry, 100, "test")
                .with_held_view(fleet_api::held::HELD_VIEW_IDLE)
                .with_events(events),
        );
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(fleet_api::serve(
            fleet_api::Listener::Unix(listener),
            router,
            shutdown,
        ));
        Env {
            etcd,
            dir,
            socket,
            _stop: stop,
        }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.join(name), text).unwrap();
    }

    /// fleetctl with `flags` then `args`, no FLEETCTL_ variable inherited.
    async fn fleetctl(&self, flags: &[String], args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        cmd.args(flags).args(args).current_dir(&self.dir);
        for (k, _) in std::env::vars() {
            if k.starts_with("FLEETCTL_") {
                cmd.env_remove(k);
            }
        }
        // The API is served by this process: run fleetctl off the runtime's thread.
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    fn over_etcd(&self) -> Vec<String> {
        vec![
            "--driver=etcd".into(),
            format!("--endpoint={}", self.etcd.endpoint()),
            format!("--etcd-key-prefix={ETCD_PREFIX}"),
        ]
    }

    fn over_api(&self) -> Vec<String> {
        vec![format!("--endpoint=unix://{}", self.socket.display())]
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn shown(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn every_command_prints_the_same_over_the_api_as_over_etcd() {
    let env = Env::start("same").await;
    env.write("a.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    env.write(
        "b.service",
        "[Unit]\nDescription=b\n\n[Service]\nExecStart=/bin/true\n",
    );
    env.write("t@.service", "[Service]\nExecStart=/bin/echo %i\n");
    env.write(
        "g.service",
        "[Service]\nExecStart=/bin/true\n\n[X-Fleet]\nGlobal=true\n",
    );
    let script: &[&[&str]] = &[
        &["list-units"],
        &["list-unit-files"],
        &["list-machines"],
        &["submit", "a.service", "b.service", "t@.service"],
        &["submit", "a.service"],
        &["load", "--no-block", "b.service"],
        &[
            "start",
            "--no-block",
            "a.service",
            "t@1.service",
            "g.service",
        ],
        &["list-unit-files"],
        &[
            "list-unit-files",
            "--full",
            "--fields=unit,hash,dstate,state,target,global,desc",
        ],
        &["list-units", "--no-legend"],
        &["cat", "a.service"],
        &["cat", "missing.service"],
        &["stop", "--no-block", "a.service"],
        &["stop", "--no-block", "missing.service"],
        &["unload", "--no-block", "b.service"],
        &["restart", "--no-block", "b.service"],
        &["start", "--no-block", "t@.service"],
        &["destroy", "b.service", "missing.service"],
        &["destroy", "t@1.service"],
        &["list-unit-files"],
    ];
    let mut differ = Vec::new();
    for args in script {
        let etcd = shown(&env.fleetctl(&env.over_etcd(), args).await);
        let api = shown(&env.fleetctl(&env.over_api(), args).await);
        if etcd != api {
            differ.push(format!("{args:?}:\n  etcd: {etcd:?}\n  api:  {api:?}"));
        }
        if std::env::var_os("FLEETCTL_TEST_SHOW").is_some() {
            eprintln!("{args:?}: {api:?}");
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

#[tokio::test]
async fn an_endpoint_on_etcds_port_picks_etcd_and_any_other_the_api() {
    let env = Env::start("pick").await;
    // Nothing listens on these: the error says which driver tried.
    let o = env
        .fleetctl(&["--endpoint=http://127.0.0.1:1".into()], &["list-units"])
        .await;
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("GET /fleet/v1/state"), "{err}");
    assert!(
        err.contains("no fleetd listens at 127.0.0.1:1 (connection refused)"),
        "{err}"
    );
    let o = env
        .fleetctl(
            &["--endpoint=unix:///nonexistent/fleet.sock".into()],
            &["list-machines"],
        )
        .await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unix:///nonexistent/fleet.sock"), "{err}");
    // The cause once, the query left out of the message.
    assert_eq!(err.matches("does not exist").count(), 1, "{err}");
    assert!(err.contains("GET /fleet/v1/machines at unix://"), "{err}");
    // Issue 38: what that means, and what to do from a host without a fleetd; no word of
    // etcd's health, which the API driver never asked about.
    assert!(
        err.contains(
            "no fleetd runs on this host: its socket /nonexistent/fleet.sock does not exist"
        ),
        "{err}"
    );
    assert!(
        err.contains("point fleetctl elsewhere with --endpoint (or FLEETCTL_ENDPOINT)"),
        "{err}"
    );
    assert!(err.contains("with --driver etcd"), "{err}");
    assert!(!err.contains("etcd unhealthy"), "{err}");
    let o = env
        .fleetctl(
            &[
                "--endpoint=http://127.0.0.1:2379".into(),
                "--request-timeout=0.5".into(),
            ],
            &["list-units"],
        )
        .await;
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("/fleet/v1"), "{err}");
}

/// fleet-api on TLS that requires a client certificate of `certs`' CA, on 127.0.0.1.
async fn serve_tls(env: &Env, certs: &TestCerts) -> std::net::SocketAddr {
    let provider = Arc::new(crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(certs.ca()).unwrap())
        .unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certs.server_cert())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(certs.server_key()).unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = Registry::new(env.etcd.kv().await, API_PREFIX);
    let router = fleet_api::router(
        // As fleetd serves it: unit listings from its held view.
        fleet_api::Api::new(registry, 100, "test").with_held_view(fleet_api::held::HELD_VIEW_IDLE),
    );
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        fleet_api::serve(
            fleet_api::Listener::Tls(listener, acceptor),
            router,
            shutdown,
        )
        .await;
        drop(stop);
    });
    addr
}

fn tls_flags(
    addr: std::net::SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Vec<String> {
    let mut flags = vec![
        format!("--endpoint=https://{addr}"),
        format!("--ca-file={}", ca.display()),
    ];
    if let Some((cert, key)) = identity {
        flags.push(format!("--cert-file={}", cert.display()));
        flags.push(format!("--key-file={}", key.display()));
    }
    flags
}

#[tokio::test]
async fn https_endpoints_take_the_ca_and_client_certificate_flags() {
    let env = Env::start("tls").await;
    let certs = TestCerts::generate(&[IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    let addr = serve_tls(&env, &certs).await;
    env.write("a.service", "[Service]\nExecStart=/bin/true\n");
    let (cert, key) = (certs.client_cert(), certs.client_key());
    let good = tls_flags(addr, &certs.ca(), Some((&cert, &key)));
    let o = env.fleetctl(&good, &["submit", "a.service"]).await;
    let submitted = "Unit a.service inactive\n".to_owned();
    assert_eq!(shown(&o), (Some(0), submitted, String::new()));
    let o = env
        .fleetctl(&good, &["list-unit-files", "--no-legend"])
        .await;
    assert_eq!(o.status.code(), Some(0), "{:?}", shown(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("a.service\t"));
    // Without a client certificate, or trusting another CA: refused, nothing listed.
    for (flags, why) in [
        (tls_flags(addr, &certs.ca(), None), "CertificateRequired"),
        (
            tls_flags(addr, &certs.wrong_ca(), Some((&cert, &key))),
            "invalid peer certificate: UnknownIssuer",
        ),
    ] {
        let o = env.fleetctl(&flags, &["list-unit-files"]).await;
        assert_eq!(o.status.code(), Some(1), "{flags:?}: {:?}", shown(&o));
        assert!(o.stdout.is_empty(), "{flags:?}: {:?}", shown(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{flags:?}: {err}");
    }
    let o = env
        .fleetctl(&[format!("--endpoint=https://{addr}")], &["list-units"])
        .await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("needs --ca-file"), "{err}");
}

/// Registers machine `id` under `prefix` and schedules `unit` there as an engine would.
async fn machine_running(env: &Env, prefix: &str, id: &str, unit: &str) {
    use fleet_core::{MachineInfo, UnitName};
    let registry = Registry::new(env.etcd.kv().await, prefix);
    let info = MachineInfo {
        id: id.parse().unwrap(),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    fleet_registry::MachineRole::new(registry.clone(), info.id.clone())
        .register(&info, std::time::Duration::from_secs(3600), None)
        .await
        .unwrap();
    let name: UnitName = unit.parse().unwrap();
    let record = registry.unit(&name).await.unwrap().unwrap();
    let entry = fleet_registry::ScheduleEntry {
        name,
        machine: info.id,
        hash: record.hash(),
        desired: record.desired(),
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    registry.write_schedule(&[entry], &[]).await.unwrap();
}

#[tokio::test]
async fn drain_undrain_and_explain_print_the_same_over_the_api_as_over_etcd() {
    let env = Env::start("drain").await;
    env.write(
        "p.service",
        "[Service]\nExecStart=/bin/sleep 1000\n\n[X-Fleet]\nMachineID=m1\n",
    );
    env.write("w.service", "[Service]\nExecStart=/bin/true\n");
    for flags in [env.over_etcd(), env.over_api()] {
        let out = env
            .fleetctl(&flags, &["submit", "p.service", "w.service"])
            .await;
        assert!(out.status.success(), "{:?}", shown(&out));
        let out = env
            .fleetctl(&flags, &["start", "--no-block", "p.service", "w.service"])
            .await;
        assert!(out.status.success(), "{:?}", shown(&out));
    }
    machine_running(&env, ETCD_PREFIX, "m1", "p.service").await;
    machine_running(&env, API_PREFIX, "m1", "p.service").await;
    let script: &[&[&str]] = &[
        &["drain", "m1"],
        &["drain", "--force", "--parallel=2", "m1"],
        &["drain", "--no-block", "m9"],
        &["list-machines"],
        &["list-machines", "--fields=machine,drained"],
        &["explain", "p.service"],
        &["explain", "--output=json", "p.service"],
        &["explain", "w.service"],
        &["explain", "missing.service"],
        &["undrain", "m1"],
        &["undrain", "m1"],
        &["list-machines", "--fields=machine,drained"],
    ];
    let mut differ = Vec::new();
    let mut api_out = Vec::new();
    for args in script {
        let etcd = shown(&env.fleetctl(&env.over_etcd(), args).await);
        let api = shown(&env.fleetctl(&env.over_api(), args).await);
        if etcd != api {
            differ.push(format!("{args:?}:\n  etcd: {etcd:?}\n  api:  {api:?}"));
        }
        api_out.push(api);
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    let (code, _, err) = &api_out[0];
    assert_eq!(*code, Some(1), "a unit that cannot leave fails the drain");
    assert!(
        err.contains(
            "Unit p.service cannot leave m1: stays on drained machine m1: no other machine"
        ),
        "{err}"
    );
    assert_eq!(
        api_out[1].0,
        Some(0),
        "--force accepts it: {:?}",
        api_out[1]
    );
    assert!(
        api_out[3].2.contains("is drained (2 move(s) at a time)"),
        "{:?}",
        api_out[3]
    );
    assert!(api_out[4].1.contains("parallel=2"), "{:?}", api_out[4]);
    assert!(
        api_out[5].1.starts_with("Unit p.service: placed\n"),
        "{:?}",
        api_out[5]
    );
    let json: serde_json::Value = serde_json::from_str(&api_out[6].1).unwrap();
    assert_eq!(json["machines"][0]["rejected"]["rule"], "drained");
    assert!(
        api_out[7].1.contains("machine is drained"),
        "a waiting unit names the drain: {:?}",
        api_out[7]
    );
    // An unknown unit is said once (issue 38: it was said as a status, a summary and an error).
    assert_eq!(
        api_out[8],
        (
            Some(1),
            String::new(),
            "Unit missing.service does not exist\n".into()
        )
    );
    assert!(
        api_out[9].1.contains("Machine m1 undrained"),
        "{:?}",
        api_out[9]
    );
    assert!(
        api_out[10].1.contains("was not drained"),
        "{:?}",
        api_out[10]
    );
    assert!(!api_out[11].1.contains("parallel="), "{:?}", api_out[11]);
}

/// The event kinds and units `fleetctl events --output json` lists.
fn listed(o: &Output) -> Vec<(String, String)> {
    assert!(o.status.success(), "{:?}", shown(o));
    let page: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or("").to_owned();
            (field("kind"), field("unit"))
        })
        .collect()
}

/// Issue 41: what a command did is recorded whichever driver it went through, and `events`
/// lists it alike over both (who asked differs: the local user over etcd, the socket's uid
/// over the API); `--follow` over the API streams an event written after it started.
#[tokio::test]
async fn events_record_each_drivers_actions_and_list_alike_over_both() {
    let env = Env::start("events").await;
    env.write("a.service", "[Service]\nExecStart=/bin/sleep 1000\n");
    for over in [env.over_etcd(), env.over_api()] {
        for args in [
            &["submit", "a.service"][..],
            &["load", "--no-block", "a.service"],
            &["destroy", "a.service"],
        ] {
            let o = env.fleetctl(&over, args).await;
            assert!(o.status.success(), "{args:?}: {:?}", shown(&o));
        }
    }
    let want = |unit: &str| {
        ["submitted", "desired-changed", "destroyed"]
            .iter()
            .map(|k| ((*k).to_owned(), unit.to_owned()))
            .collect::<Vec<_>>()
    };
    let args = ["events", "--output", "json", "--unit", "a.service"];
    // The API writes its events in the background: they come within a moment.
    let mut api = Vec::new();
    for _ in 0..50 {
        api = listed(&env.fleetctl(&env.over_api(), &args).await);
        if api.len() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(api, want("a.service"));
    let etcd = listed(&env.fleetctl(&env.over_etcd(), &args).await);
    assert_eq!(etcd, want("a.service"));
    let table = env.fleetctl(&env.over_etcd(), &["events"]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("TIME") && text.contains("destroyed") && text.contains("local"),
        "{text}"
    );

    let mut follow = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
    follow
        .args(env.over_api())
        .args([
            "events",
            "--follow",
            "--output",
            "json",
            "--unit",
            "b.service",
        ])
        .stdout(std::process::Stdio::piped());
    let mut child = follow.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().next()
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    env.write("b.service", "[Service]\nExecStart=/bin/sleep 1001\n");
    let o = env
        .fleetctl(&env.over_api(), &["submit", "b.service"])
        .await;
    assert!(o.status.success(), "{:?}", shown(&o));
    let line = tokio::time::timeout(std::time::Duration::from_secs(5), first).await;
    let _ = child.kill();
    let _ = child.wait();
    let line = line
        .expect("followed within 5 s")
        .unwrap()
        .unwrap()
        .unwrap();
    let event: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["kind"], "submitted");
    assert_eq!(event["unit"], "b.service");
    assert!(
        event["who"].as_str().unwrap_or("").starts_with("local"),
        "{event}"
    );
}
