//! `--output json`, `set-metadata`/`unset-metadata` and `version`, each run over both drivers
//! against one registry: etcd directly, and fleet-api's router served here on a unix socket
//! over the same etcd and key prefix. Reads must print the same bytes either way; writes made
//! over one driver are seen over the other.

use fleet_core::MachineInfo;
use fleet_registry::Registry;
use fleet_registry::kv::{EtcdKv, Kv};
use fleet_testing::{TestEtcd, machine_running};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

struct Env {
    etcd: TestEtcd,
    registry: Registry<EtcdKv>,
    dir: PathBuf,
    socket: PathBuf,
    _stop: tokio::sync::watch::Sender<bool>,
}

impl Env {
    async fn start(test: &str) -> Env {
        let etcd = TestEtcd::start().await;
        let dir = std::env::temp_dir().join(format!("fleetctl-json-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("fleet.sock");
        let registry = Registry::new(etcd.kv().await, fleet_registry::DEFAULT_PREFIX);
        let router = fleet_api::router(fleet_api::Api::new(registry.clone(), 100, "test"));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(fleet_api::serve(
            fleet_api::Listener::Unix(listener),
            router,
            shutdown,
        ));
        Env {
            etcd,
            registry,
            dir,
            socket,
            _stop: stop,
        }
    }

    fn flags(&self, driver: Driver) -> Vec<String> {
        match driver {
            Driver::Etcd => vec![
                "--driver=etcd".into(),
                format!("--endpoint={}", self.etcd.endpoint()),
            ],
            Driver::Api => vec![format!("--endpoint=unix://{}", self.socket.display())],
            Driver::Nowhere => vec![],
        }
    }

    /// fleetctl over `driver`, no FLEETCTL_ variable inherited, off the runtime's thread
    /// (the API is served by this process).
    async fn fleetctl(&self, driver: Driver, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        cmd.args(self.flags(driver))
            .args(args)
            .current_dir(&self.dir);
        for (k, _) in std::env::vars() {
            if k.starts_with("FLEETCTL_") {
                cmd.env_remove(k);
            }
        }
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    /// Runs `args` over both drivers, requires the same exit code and bytes, returns them.
    async fn both(&self, args: &[&str]) -> Shown {
        let etcd = shown(&self.fleetctl(Driver::Etcd, args).await);
        let api = shown(&self.fleetctl(Driver::Api, args).await);
        assert_eq!(etcd, api, "{args:?}: etcd vs api");
        api
    }

    async fn register(&self, id: &str, version: &str, metadata: &[(&str, &str)]) {
        let info = MachineInfo {
            id: id.parse().unwrap(),
            public_ip: "10.0.0.1".into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            version: version.into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        machine_running(&self.registry, &info, Duration::from_secs(3600), &[]).await;
    }

    /// Every key and value in etcd, to prove a refused command wrote nothing.
    async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let kv = self.etcd.kv().await;
        kv.range("/", true, None)
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug, Clone, Copy)]
enum Driver {
    Etcd,
    Api,
    /// No flags: the test's own `--endpoint` decides.
    Nowhere,
}

type Shown = (Option<i32>, String, String);

fn shown(o: &Output) -> Shown {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[track_caller]
fn json(s: &Shown) -> Value {
    assert_eq!(s.0, Some(0), "{s:?}");
    assert_eq!(s.2, "", "stderr stays empty with json: {s:?}");
    serde_json::from_str(&s.1).unwrap_or_else(|e| panic!("not one JSON document: {e}: {s:?}"))
}

#[tokio::test]
async fn listings_print_one_json_document_the_same_over_both_drivers() {
    let env = Env::start("listings").await;
    // An empty cluster: the lists are there, empty.
    let empty = json(&env.both(&["list-unit-files", "--output=json"]).await);
    assert_eq!(empty, serde_json::json!({"units": [], "skipped": []}));

    std::fs::write(
        env.dir.join("a.service"),
        "[Unit]\nDescription=a\n\n[Service]\nExecStart=/bin/sleep 1000\n",
    )
    .unwrap();
    let o = env
        .fleetctl(Driver::Etcd, &["start", "--no-block", "a.service"])
        .await;
    assert!(o.status.success(), "{:?}", shown(&o));
    env.register("m1", "0.1.0", &[("role", "web")]).await;
    let name = "a.service".parse().unwrap();
    let record = env.registry.unit(&name).await.unwrap().unwrap();
    let entry = fleet_registry::ScheduleEntry {
        name,
        machine: "m1".parse().unwrap(),
        hash: record.hash(),
        desired: record.desired(),
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    env.registry.write_schedule(&[entry], &[]).await.unwrap();
    let o = env
        .fleetctl(Driver::Api, &["drain", "--no-block", "m9"])
        .await;
    assert!(o.status.success(), "{:?}", shown(&o));

    let files = json(&env.both(&["list-unit-files", "--output=json"]).await);
    let unit = &files["units"][0];
    assert_eq!(unit["name"], "a.service");
    assert_eq!(unit["desiredState"], "launched");
    assert_eq!(unit["machineID"], "m1");
    assert_eq!(unit["machineIDs"], serde_json::json!(["m1"]));
    assert_eq!(unit["hash"].as_str().map(str::len), Some(40), "{unit}");
    assert_eq!(unit["options"][0]["section"], "Unit");

    let machines = json(&env.both(&["list-machines", "--output=json"]).await);
    assert_eq!(machines["machines"][0]["id"], "m1");
    assert_eq!(machines["machines"][0]["metadata"]["role"], "web");
    assert_eq!(machines["machines"][0]["version"], "0.1.0");
    assert_eq!(machines["drains"][0]["machine"], "m9");
    assert_eq!(machines["drains"][0]["parallel"], 1);

    let states = json(&env.both(&["list-units", "--output=json"]).await);
    assert_eq!(states, serde_json::json!({"states": [], "skipped": []}));

    // --full and --no-legend change nothing; --fields is refused, before anything is read.
    for command in ["list-unit-files", "list-units", "list-machines"] {
        let plain = env.both(&[command, "--output=json"]).await;
        let flagged = env
            .both(&[command, "--output=json", "--full", "--no-legend"])
            .await;
        assert_eq!(plain, flagged, "{command}");
        let refused = env.both(&[command, "--output=json", "--fields=unit"]).await;
        assert_eq!(refused.0, Some(1), "{refused:?}");
        assert!(
            refused
                .2
                .contains("--fields chooses the columns of a table"),
            "{refused:?}"
        );
        // The text tables are unchanged, default columns included.
        let text = env.both(&[command, "--output=text"]).await;
        assert_eq!(text, env.both(&[command]).await);
    }
    let text = env.both(&["list-machines", "--no-legend"]).await;
    assert_eq!(text.1, "m1...\t10.0.0.1\trole=web\n");
}

#[tokio::test]
async fn set_and_unset_metadata_write_over_either_driver_and_refuse_bad_input_writing_nothing() {
    let env = Env::start("metadata").await;
    env.register("m1aa", "0.1.0", &[("role", "web")]).await;
    env.register("m2bb", "0.1.0", &[]).await;
    let metadata = |doc: &Value| doc["machines"][0]["metadata"].clone();

    let o = shown(
        &env.fleetctl(Driver::Etcd, &["set-metadata", "m1", "region=us", "az=a"])
            .await,
    );
    assert_eq!(
        o,
        (
            Some(0),
            "Machine m1aa: set region=us, az=a\n".into(),
            String::new()
        )
    );
    let o = shown(
        &env.fleetctl(Driver::Api, &["set-metadata", "m1aa", "az=b"])
            .await,
    );
    assert_eq!(o.0, Some(0), "{o:?}");
    let listed = json(&env.both(&["list-machines", "--output=json"]).await);
    assert_eq!(
        metadata(&listed),
        serde_json::json!({"az": "b", "region": "us", "role": "web"})
    );
    // A dynamic value wins over the configured one.
    let o = shown(
        &env.fleetctl(Driver::Api, &["set-metadata", "m1", "role=db"])
            .await,
    );
    assert_eq!(o.0, Some(0), "{o:?}");
    let text = env.both(&["list-machines", "--no-legend"]).await;
    assert!(
        text.1
            .starts_with("m1aa...\t10.0.0.1\taz=b,region=us,role=db\n"),
        "{text:?}"
    );

    let before = env.dump().await;
    let refused: &[(&[&str], &str)] = &[
        (
            &["set-metadata", "m1", "region"],
            "\"region\" is not key=value",
        ),
        (
            &["set-metadata", "m1", "ok=1", "bad key=x"],
            "must be letters",
        ),
        (&["set-metadata", "m1", "region="], "is empty"),
        (
            &["set-metadata", "m1", "region=a b"],
            "could never match it",
        ),
        (&["set-metadata", "m1", "a=1", "a=2"], "given twice"),
        (&["set-metadata", "m1"], "No metadata given"),
        (
            &["set-metadata", "m", "a=1"],
            "is ambiguous: 2 machines match",
        ),
        (&["set-metadata", "M/1", "a=1"], "invalid machine ID"),
        (&["unset-metadata", "m1", "a=1"], "must be letters"),
        (&["unset-metadata", "m1"], "No metadata keys given"),
    ];
    for (args, why) in refused {
        let o = env.both(args).await;
        assert_eq!(o.0, Some(1), "{args:?}: {o:?}");
        assert!(o.2.contains(why), "{args:?}: {o:?}");
        assert_eq!(o.1, "", "{args:?}");
    }
    assert_eq!(env.dump().await, before, "a refused command writes nothing");

    let o = shown(
        &env.fleetctl(Driver::Api, &["unset-metadata", "m1", "region", "role"])
            .await,
    );
    // role is configured too: removing the dynamic value shows the configured one again, so
    // role was not unset, and the command fails saying so (issue 38).
    assert_eq!(o.0, Some(1), "{o:?}");
    assert_eq!(o.1, "Machine m1aa: unset region\n");
    let listed = json(&env.both(&["list-machines", "--output=json"]).await);
    assert_eq!(
        metadata(&listed),
        serde_json::json!({"az": "b", "role": "web"})
    );
    assert_eq!(
        o.2,
        "machine m1aa still has role=web: its fleetd's configured metadata (its metadata= \
         setting); unset-metadata removes only what set-metadata set\n"
    );
    let o = shown(
        &env.fleetctl(Driver::Etcd, &["unset-metadata", "m1", "az"])
            .await,
    );
    assert_eq!(
        o,
        (Some(0), "Machine m1aa: unset az\n".into(), String::new())
    );
    let listed = json(&env.both(&["list-machines", "--output=json"]).await);
    assert_eq!(metadata(&listed), serde_json::json!({"role": "web"}));

    // A machine not registered (yet) may get metadata, with a warning.
    let o = shown(
        &env.fleetctl(Driver::Api, &["set-metadata", "m9", "a=1"])
            .await,
    );
    assert_eq!(o.0, Some(0), "{o:?}");
    assert!(o.2.contains("machine m9 is not registered"), "{o:?}");
}

#[tokio::test]
async fn version_groups_the_fleetds_and_still_prints_when_the_cluster_is_away() {
    let env = Env::start("version").await;
    env.register("m1", "0.2.0", &[]).await;
    env.register("m2", "0.1.0", &[]).await;
    env.register("m3", "0.1.0", &[]).await;
    let ours = env!("CARGO_PKG_VERSION");
    let text = env.both(&["version"]).await;
    assert_eq!(
        text,
        (
            Some(0),
            format!("fleetctl version {ours}\nfleetd 0.1.0: 2 machines\nfleetd 0.2.0: 1 machine\n"),
            String::new()
        )
    );
    let doc = json(&env.both(&["version", "--output=json"]).await);
    assert_eq!(
        doc,
        serde_json::json!({
            "fleetctl": ours,
            "fleetds": [
                {"version": "0.1.0", "machineIDs": ["m2", "m3"]},
                {"version": "0.2.0", "machineIDs": ["m1"]},
            ]
        })
    );
    let o = env.fleetctl(Driver::Api, &["--version"]).await;
    assert_eq!(
        shown(&o),
        (Some(0), format!("fleetctl version {ours}\n"), String::new())
    );

    // Nothing listens there: fleetctl's version all the same, exit 0, why on stderr.
    let away = ["--endpoint=unix:///nonexistent/fleet.sock", "version"];
    let o = shown(&env.fleetctl(Driver::Nowhere, &away).await);
    assert_eq!(o.0, Some(0), "{o:?}");
    assert_eq!(o.1, format!("fleetctl version {ours}\n"));
    assert!(
        o.2.starts_with("Warning: the cluster cannot be reached"),
        "{o:?}"
    );
    assert!(o.2.contains("/nonexistent/fleet.sock"), "{o:?}");
    let away = [
        "--endpoint=unix:///nonexistent/fleet.sock",
        "version",
        "--output=json",
    ];
    let o = shown(&env.fleetctl(Driver::Nowhere, &away).await);
    assert_eq!(o.0, Some(0), "{o:?}");
    let doc: Value = serde_json::from_str(&o.1).unwrap();
    assert_eq!(doc["fleetctl"], ours);
    assert!(doc["fleetds"].is_null(), "{doc}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/fleet.sock")
    );
}
