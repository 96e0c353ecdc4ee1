//! The driver fleetctl's end-to-end suites (`cli.rs`, `bad_input.rs`) run fleetctl over,
//! chosen by `FLEETCTL_TEST_DRIVER`: `etcd` (the default) hands fleetctl the test etcd's
//! endpoint; `api` serves fleet-api's router on a unix socket over the same etcd and key
//! prefix, and hands fleetctl that socket. The suites' own registry reads and writes stay on
//! etcd either way, so "nothing was written" is checked where it is stored.
//!
//! The API is served on a thread of its own with its own runtime: the suites run fleetctl
//! with blocking `Command::output` from their `#[tokio::test]` thread, which must not be the
//! one serving fleetctl's requests.

// Each suite uses part of this module.
#![allow(dead_code)]

use fleet_registry::Registry;
use fleet_registry::kv::EtcdKv;
use fleet_testing::TestEtcd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The variable naming the driver.
const VAR: &str = "FLEETCTL_TEST_DRIVER";

/// How fleetctl reaches the test etcd.
pub enum Over {
    /// Straight to etcd (`--driver etcd --endpoint <etcd>`).
    Etcd,
    /// Through fleet-api served on `socket` (`--driver api --endpoint unix://<socket>`).
    Api { socket: PathBuf, _stop: Stop },
}

/// Stops the API server and removes its socket when dropped.
pub struct Stop {
    stop: tokio::sync::watch::Sender<bool>,
    socket: PathBuf,
}

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// True when `FLEETCTL_TEST_DRIVER` is `api`. Panics on any value but `api` and `etcd`, so a
/// typo does not silently test the default.
pub fn api_chosen() -> bool {
    match std::env::var(VAR) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v == "etcd" => false,
        Ok(v) if v == "api" => true,
        other => panic!("{VAR} must be api or etcd, not {other:?}"),
    }
}

impl Over {
    /// The driver `FLEETCTL_TEST_DRIVER` names; with `api`, a server over `etcd` under the
    /// default key prefix, on a socket in the temporary directory (a test's scratch
    /// directory can be too deep for a socket's 108-byte path).
    pub fn chosen(etcd: &TestEtcd) -> Over {
        static SERVED: AtomicUsize = AtomicUsize::new(0);
        if !api_chosen() {
            return Over::Etcd;
        }
        let n = SERVED.fetch_add(1, Ordering::Relaxed);
        let socket =
            std::env::temp_dir().join(format!("fleetctl-e2e-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let config = etcd.config();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let at = socket.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let kv = EtcdKv::connect(&config).await.unwrap();
                let registry = Registry::new(kv, fleet_registry::DEFAULT_PREFIX);
                let router = fleet_api::router(
                    // As fleetd serves it: unit listings from its held view.
                    fleet_api::Api::new(registry, 100, "test")
                        .with_held_view(fleet_api::held::HELD_VIEW_IDLE),
                );
                let listener = tokio::net::UnixListener::bind(&at).unwrap();
                ready_tx.send(()).unwrap();
                fleet_api::serve(fleet_api::Listener::Unix(listener), router, shutdown).await;
            });
        });
        ready.recv().expect("the API server starts");
        Over::Api {
            socket: socket.clone(),
            _stop: Stop { stop, socket },
        }
    }

    /// True over the API driver.
    pub fn is_api(&self) -> bool {
        matches!(self, Over::Api { .. })
    }

    /// The driver's name, for `--driver` or `FLEETCTL_DRIVER`.
    pub fn driver(&self) -> &'static str {
        match self {
            Over::Etcd => "etcd",
            Over::Api { .. } => "api",
        }
    }

    /// fleetctl's endpoint: etcd's `endpoint`, or the API's socket.
    pub fn endpoint(&self, endpoint: &str) -> String {
        match self {
            Over::Etcd => endpoint.to_owned(),
            Over::Api { socket, .. } => format!("unix://{}", socket.display()),
        }
    }

    /// Points `cmd` at the cluster: `--endpoint` as a flag, the driver in `FLEETCTL_DRIVER`
    /// (so that a test's own `--driver` flag still overrides it). No FLEETCTL_ENDPOINT is
    /// inherited.
    pub fn apply(&self, cmd: &mut Command, endpoint: &str) {
        cmd.arg("--endpoint")
            .arg(self.endpoint(endpoint))
            .env_remove("FLEETCTL_ENDPOINT")
            .env("FLEETCTL_DRIVER", self.driver());
    }

    /// Points `cmd` at the cluster with FLEETCTL_DRIVER and FLEETCTL_ENDPOINT only.
    pub fn env(&self, cmd: &mut Command, endpoint: &str) {
        cmd.env("FLEETCTL_DRIVER", self.driver())
            .env("FLEETCTL_ENDPOINT", self.endpoint(endpoint));
    }
}
