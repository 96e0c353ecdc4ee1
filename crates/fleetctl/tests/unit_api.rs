//! fleetctl's client of a machine's status and journal routes (`driver::unit_api`) against
//! fleet-api's router with the fake inspector, served on a unix socket as fleetd serves it:
//! the document, the errors fleetctl prints, a journal streamed as it comes, and a followed
//! journal that ends on the server side when fleetctl drops it (Ctrl-C).

use fleet_api::inspect::fake::FakeInspector;
use fleet_core::{DesiredState, UnitFile, UnitName};
use fleet_ops::{Cluster, PutRequest, RegistryCluster, ReplaceHow};
use fleet_registry::kv::{MemKv, TlsFiles};
use fleet_registry::{Registry, ScheduleEntry};
use fleetctl::driver::unit_api::{JournalQuery, UnitApi};
use std::sync::Arc;
use std::time::Duration;

const HERE: &str = "m1";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// fleetd's API as machine [`HERE`], with the fake inspector, and a client of it.
async fn serve(test: &str) -> (Registry<MemKv>, FakeInspector, UnitApi) {
    let dir = std::env::temp_dir().join(format!("fleetctl-unit-api-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("fleet.sock");
    let registry = Registry::new(MemKv::new(), "/unit-api/");
    let fake = FakeInspector::new();
    let api = fleet_api::Api::new(registry.clone(), 100, "test")
        .with_inspector(HERE.parse().unwrap(), Arc::new(fake.clone()));
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    // The server lives as long as the test's runtime.
    std::mem::forget(stop);
    tokio::spawn(fleet_api::serve(
        fleet_api::Listener::Unix(listener),
        fleet_api::router(api),
        shutdown,
    ));
    let endpoint = format!("unix://{}", socket.display());
    let client = UnitApi::new(&endpoint, &TlsFiles::default(), Duration::from_secs(5)).unwrap();
    (registry, fake, client)
}

/// `unit` launched and scheduled on `machine`, as the engine would leave it.
async fn scheduled(registry: &Registry<MemKv>, unit: &str, machine: &str) {
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    let hash = file.hash();
    RegistryCluster::new(registry.clone())
        .put(PutRequest {
            name: name(unit),
            file: Some(file),
            desired: Some(DesiredState::Launched),
            how: ReplaceHow::default(),
        })
        .await
        .unwrap();
    let entry = ScheduleEntry {
        name: name(unit),
        machine: machine.parse().unwrap(),
        hash,
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    registry.write_schedule(&[entry], &[]).await.unwrap();
}

fn query(follow: bool) -> JournalQuery {
    JournalQuery {
        lines: 10,
        follow,
        output: "short".into(),
    }
}

#[tokio::test]
async fn the_status_of_a_unit_here_is_its_machines_document() {
    let (registry, _fake, client) = serve("status").await;
    scheduled(&registry, "a.service", HERE).await;
    let status = client.status(&name("a.service")).await.unwrap();
    assert_eq!(status.machine_id, HERE);
    assert_eq!(status.name, "a.service");
    assert!(
        status.text.contains("Active: active (running)"),
        "{status:?}"
    );
    assert_eq!(status.properties["ActiveState"], "active");
}

#[tokio::test]
async fn a_unit_of_another_machine_or_none_is_an_error_with_the_servers_message() {
    let (registry, fake, client) = serve("elsewhere").await;
    scheduled(&registry, "b.service", "m2").await;
    for unit in ["b.service", "nope.service"] {
        let e = client.status(&name(unit)).await.unwrap_err().to_string();
        assert!(!e.is_empty() && !e.contains('\n'), "{unit}: {e}");
        let e = client
            .journal(&name(unit), &query(false))
            .await
            .unwrap_err();
        assert!(!e.to_string().is_empty(), "{unit}");
    }
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test]
async fn a_journal_streams_as_it_comes_and_ends_when_the_server_ends_it() {
    let (registry, fake, client) = serve("journal").await;
    scheduled(&registry, "c.service", HERE).await;
    let mut stream = client
        .journal(&name("c.service"), &query(false))
        .await
        .unwrap();
    let sender = fake.next_journal().await;
    sender.send("first line\n".into()).unwrap();
    assert_eq!(stream.next_chunk().await.unwrap().unwrap(), "first line\n");
    sender.send("second line\n".into()).unwrap();
    assert_eq!(stream.next_chunk().await.unwrap().unwrap(), "second line\n");
    drop(sender);
    assert!(stream.next_chunk().await.unwrap().is_none());
}

#[tokio::test]
async fn dropping_a_followed_journal_ends_it_on_the_server() {
    let (registry, fake, client) = serve("follow").await;
    scheduled(&registry, "d.service", HERE).await;
    let mut stream = client
        .journal(&name("d.service"), &query(true))
        .await
        .unwrap();
    let sender = fake.next_journal().await;
    sender.send("tick\n".into()).unwrap();
    assert_eq!(stream.next_chunk().await.unwrap().unwrap(), "tick\n");
    drop(stream);
    tokio::time::timeout(Duration::from_secs(10), fake.wait_journal_dropped(1))
        .await
        .expect("the server dropped the followed journal once the client left");
}
