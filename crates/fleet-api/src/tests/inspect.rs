//! `GET /units/<name>/status` and `/journal` over the fake inspector: what is answered, what
//! is streamed and for how long, and that a request refused (bad query, a unit that is not
//! this machine's, etcd away) runs nothing.

use super::*;
use crate::inspect::fake::{Call, FakeInspector};
use crate::inspect::{JournalRequest, MAX_JOURNALS};
use bytes::Bytes;
use std::sync::Arc;

const HERE: &str = "m1";

/// A router whose inspector is `fake`, serving as machine [`HERE`].
fn inspecting() -> (Fixture, MemKv, FakeInspector) {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/fleet/");
    let fake = FakeInspector::new();
    let api = Api::new(registry.clone(), 100, VERSION)
        .with_inspector(HERE.parse().unwrap(), Arc::new(fake.clone()));
    (
        Fixture {
            registry,
            router: router(api),
        },
        kv,
        fake,
    )
}

/// Creates `name` launched and schedules it on `machines`, as the engine would (a global unit
/// has an entry on each machine it applies to).
async fn scheduled(f: &Fixture, name: &str, machines: &[&str]) {
    let answer = f
        .put(
            &format!("/fleet/v1/units/{name}"),
            json!({"options": options("/bin/true"), "desiredState": "launched"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let entries: Vec<ScheduleEntry> = machines
        .iter()
        .map(|m| ScheduleEntry {
            name: name.parse().unwrap(),
            machine: m.parse().unwrap(),
            hash: file("/bin/true").hash(),
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        })
        .collect();
    if !entries.is_empty() {
        f.registry.write_schedule(&entries, &[]).await.unwrap();
    }
}

async fn journal_response(f: &Fixture, path: &str) -> http::Response<Body> {
    let req = Request::get(path).body(Body::empty()).unwrap();
    f.router.clone().oneshot(req).await.unwrap()
}

fn journal_call(unit: &str, lines: u32, follow: bool, output: &'static str) -> Call {
    Call::Journal {
        unit: unit.parse().unwrap(),
        request: JournalRequest {
            lines,
            follow,
            output,
        },
    }
}

#[tokio::test]
async fn the_status_of_a_unit_scheduled_here_is_its_text_and_properties() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let answer = f.get("/fleet/v1/units/a.service/status?lines=5").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        answer.body,
        json!({
            "machineID": HERE,
            "name": "a.service",
            "text": "● a.service\n   Active: active (running)\n",
            "properties": {"ActiveState": "active", "Id": "a.service"},
        })
    );
    let default = f.get("/v1-alpha/units/a.service/status").await;
    assert_eq!(default.status, StatusCode::OK);
    let unit = |lines| Call::Status {
        unit: "a.service".parse().unwrap(),
        lines,
    };
    assert_eq!(fake.calls(), vec![unit(5), unit(10)]);
}

#[tokio::test]
async fn a_global_unit_is_inspected_on_each_machine_it_applies_to() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "g.service", &["m0", HERE, "m2"]).await;
    assert_eq!(
        f.get("/fleet/v1/units/g.service/status").await.status,
        StatusCode::OK
    );
    scheduled(&f, "h.service", &["m0", "m2", "m3", "m4"]).await;
    assert_error(
        &f.get("/fleet/v1/units/h.service/status").await,
        StatusCode::NOT_FOUND,
        "unit h.service is scheduled on machines m0, m2, m3 and 1 more, not on this one (m1)",
    );
    assert_eq!(fake.calls().len(), 1);
}

#[tokio::test]
async fn a_journal_is_streamed_as_plain_text_with_the_asked_lines_and_output() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let resp = journal_response(
        &f,
        "/fleet/v1/units/a.service/journal?lines=3&follow=false&output=json",
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get(header::CONTENT_TYPE).unwrap(),
        "text/plain; charset=utf-8"
    );
    let journal = fake.next_journal().await;
    journal
        .send(Bytes::from_static(b"{\"MESSAGE\":\"one\"}\n"))
        .unwrap();
    journal
        .send(Bytes::from_static(b"{\"MESSAGE\":\"two\"}\n"))
        .unwrap();
    drop(journal);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"MESSAGE\":\"one\"}\n{\"MESSAGE\":\"two\"}\n");
    // The defaults: fleetctl's 10 lines, journalctl's short output, no follow.
    let resp = journal_response(&f, "/fleet/v1/units/a.service/journal").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        fake.calls(),
        vec![
            journal_call("a.service", 3, false, "json"),
            journal_call("a.service", 10, false, "short"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_followed_journal_is_dropped_when_the_client_goes_away() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let resp = journal_response(&f, "/fleet/v1/units/a.service/journal?follow=true").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let journal = fake.next_journal().await;
    let mut body = resp.into_body();
    journal.send(Bytes::from_static(b"first\n")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first\n");
    // Still streaming: more comes as the unit logs it.
    journal.send(Bytes::from_static(b"later\n")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "later\n");
    drop(body);
    fake.wait_journal_dropped(1).await;
    assert!(journal.is_closed());
    assert_eq!(
        fake.calls(),
        vec![journal_call("a.service", 10, true, "short")]
    );
}

#[tokio::test]
async fn a_followed_journal_ends_when_the_client_disconnects_from_a_socket() {
    use hyper_util::rt::TokioIo;
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(crate::serve(
        crate::Listener::Tcp(tcp),
        f.router.clone(),
        stopped,
    ));
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get("/fleet/v1/units/a.service/journal?follow=true")
        .header(header::HOST, "x")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let journal = fake.next_journal().await;
    journal.send(Bytes::from_static(b"first\n")).unwrap();
    let mut body = resp.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first\n");
    // The client goes away while the unit logs nothing: the server notices the closed
    // connection without writing to it.
    drop((body, send));
    conn.abort();
    tokio::time::timeout(Duration::from_secs(20), fake.wait_journal_dropped(1))
        .await
        .expect("the journal stream is dropped once the client is gone");
}

#[tokio::test]
async fn bad_lines_follow_or_output_are_400_and_run_nothing() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let lines = "lines must be a whole number from 0 to 100000, got";
    let modes = fleet_api_wire::wire::JOURNAL_OUTPUTS.join(", ");
    for (query, message) in [
        ("lines=-1", format!("{lines} \"-1\"")),
        ("lines=%2B5", format!("{lines} \"+5\"")),
        ("lines=100001", format!("{lines} \"100001\"")),
        ("lines=ten", format!("{lines} \"ten\"")),
        ("lines=", format!("{lines} \"\"")),
        (
            "follow=yes",
            "follow must be true or false, got \"yes\"".to_owned(),
        ),
        (
            "output=json%20--all",
            format!("output must be one of {modes}, got \"json --all\""),
        ),
        (
            "output=",
            format!("output must be one of {modes}, got \"\""),
        ),
    ] {
        let path = format!("/fleet/v1/units/a.service/journal?{query}");
        assert_error(&f.get(&path).await, StatusCode::BAD_REQUEST, &message);
    }
    assert_error(
        &f.get("/fleet/v1/units/a.service/status?lines=x").await,
        StatusCode::BAD_REQUEST,
        &format!("{lines} \"x\""),
    );
    // A bad query is refused before the registry is read: a missing unit is a 400 too.
    assert_eq!(
        f.get("/fleet/v1/units/nothing.service/journal?lines=x")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(fake.calls(), vec![]);
    let path = "/fleet/v1/units/a.service/journal?lines=100000&follow=false&output=cat";
    assert_eq!(journal_response(&f, path).await.status(), StatusCode::OK);
    assert_eq!(
        fake.calls(),
        vec![journal_call("a.service", 100_000, false, "cat")]
    );
}

#[tokio::test]
async fn a_unit_that_is_unknown_unscheduled_or_elsewhere_is_404_and_runs_nothing() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "waiting.service", &[]).await;
    scheduled(&f, "there.service", &["m2"]).await;
    for aspect in ["status", "journal"] {
        let f = &f;
        let get = |unit: &str| {
            let path = format!("/fleet/v1/units/{unit}/{aspect}");
            async move { f.get(&path).await }
        };
        assert_error(
            &get("nothing.service").await,
            StatusCode::NOT_FOUND,
            "unit does not exist",
        );
        assert_error(
            &get("no%20name").await,
            StatusCode::NOT_FOUND,
            "unit does not exist",
        );
        assert_error(
            &get("waiting.service").await,
            StatusCode::NOT_FOUND,
            "unit waiting.service is not scheduled anywhere",
        );
        assert_error(
            &get("there.service").await,
            StatusCode::NOT_FOUND,
            "unit there.service is scheduled on machine m2, not on this one (m1)",
        );
    }
    // The full view names the reason a client can act on.
    let full = f
        .get("/fleet/v1/units/nothing.service/status?view=full")
        .await;
    assert_eq!(full.body["error"]["reason"], "noSuchUnit");
    assert_eq!(fake.calls(), vec![]);
}

#[tokio::test]
async fn a_unit_the_agent_refuses_here_is_404_and_runs_nothing() {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/fleet/");
    let fake = FakeInspector::new();
    let api = Api::new(registry.clone(), 100, VERSION)
        .with_inspector(HERE.parse().unwrap(), Arc::new(fake.clone()))
        .refusing(vec!["sshd.service".into(), "systemd-*".into()]);
    let f = Fixture {
        registry,
        router: router(api),
    };
    scheduled(&f, "sshd.service", &[HERE]).await;
    scheduled(&f, "systemd-logind.service", &[HERE]).await;
    for unit in ["sshd.service", "systemd-logind.service"] {
        for aspect in ["status", "journal"] {
            assert_error(
                &f.get(&format!("/fleet/v1/units/{unit}/{aspect}")).await,
                StatusCode::NOT_FOUND,
                &format!(
                    "unit {unit} matches deny_units here: fleetd does not manage it on this machine"
                ),
            );
        }
    }
    assert_eq!(fake.calls(), vec![]);
}

#[tokio::test]
async fn status_and_journal_are_503_while_etcd_is_away_and_run_nothing() {
    let (f, kv, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    kv.set_unavailable(true);
    for path in [
        "/fleet/v1/units/a.service/status",
        "/fleet/v1/units/a.service/journal?follow=true",
    ] {
        assert_error(
            &f.get(path).await,
            StatusCode::SERVICE_UNAVAILABLE,
            "fleet server unable to communicate with etcd",
        );
    }
    assert_eq!(fake.calls(), vec![]);
}

#[tokio::test]
async fn only_get_is_allowed_and_an_api_without_inspector_serves_neither() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    for path in [
        "/fleet/v1/units/a.service/status",
        "/fleet/v1/units/a.service/journal",
    ] {
        assert_error(
            &f.request(Method::POST, path).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET supported against this resource",
        );
    }
    assert_eq!(fake.calls(), vec![]);
    let (plain, _) = fixture(100);
    assert_error(
        &plain.get("/fleet/v1/units/a.service/status").await,
        StatusCode::NOT_FOUND,
        "unit status and journals are not served here",
    );
}

#[tokio::test]
async fn a_failing_inspector_is_500_with_what_failed() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    fake.fail(true);
    let answer = f.get("/fleet/v1/units/a.service/status").await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.body["error"]["message"],
        "inspecting the unit failed: running systemctl"
    );
}

#[tokio::test]
async fn journals_beyond_the_limit_are_503_until_one_ends() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let path = "/fleet/v1/units/a.service/journal?follow=true";
    let mut open = Vec::new();
    for _ in 0..MAX_JOURNALS {
        let resp = journal_response(&f, path).await;
        assert_eq!(resp.status(), StatusCode::OK);
        open.push(resp);
    }
    assert_error(
        &f.get(path).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "already streaming 64 journals; try again later",
    );
    assert_eq!(fake.calls().len(), MAX_JOURNALS);
    drop(open.pop());
    assert_eq!(journal_response(&f, path).await.status(), StatusCode::OK);
}

/// Issue 37, item 6: an agent-only host's etcd user holds its machine role alone, which
/// reads its own schedule but not the units. Its API still serves the status of a unit
/// scheduled there, and says of one scheduled elsewhere only that it is not here (404),
/// never a 403.
#[tokio::test]
async fn an_agent_only_host_serves_its_own_units_status_with_its_machine_role_alone() {
    use fleet_registry::kv::Rbac;
    let (f, kv, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    scheduled(&f, "b.service", &["m2"]).await;
    let keys = fleet_registry::Keys::new("/fleet/");
    let role = fleet_registry::rbac::machine(&keys, &HERE.parse().unwrap());
    let confined = Rbac::new(kv, "fleet-host-m1", vec![role]);
    let api = Api::new(Registry::new(confined, "/fleet/"), 100, VERSION)
        .with_inspector(HERE.parse().unwrap(), Arc::new(fake.clone()));
    let router = router(api);
    let get = |path: &'static str| {
        let router = router.clone();
        async move {
            let req = Request::get(path).body(Body::empty()).unwrap();
            router.oneshot(req).await.unwrap().status()
        }
    };
    assert_eq!(
        get("/fleet/v1/units/a.service/status").await,
        StatusCode::OK
    );
    assert_eq!(
        get("/fleet/v1/units/b.service/status").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get("/fleet/v1/units/b.service/journal").await,
        StatusCode::NOT_FOUND
    );
}

/// Issue 37, item 10: a unit named like a slice would read every service's journal under it
/// (systemctl and journalctl match a slice's journal by its members). Its journal is refused
/// (400) before anything runs, and its status comes without journal lines.
#[tokio::test]
async fn a_slices_journal_is_refused_and_its_status_carries_no_journal_lines() {
    let (f, _, fake) = inspecting();
    scheduled(&f, "system.slice", &[HERE]).await;
    let answer = f.get("/fleet/v1/units/system.slice/journal?lines=50").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(
        answer.body["error"]["message"],
        "the journal is served for .service units only, not system.slice"
    );
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
    let answer = f.get("/fleet/v1/units/system.slice/status?lines=50").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(
        fake.calls(),
        [Call::Status {
            unit: "system.slice".parse().unwrap(),
            lines: 0
        }]
    );
}

/// Issue 37, item 4: each status runs `systemctl status`; a client asking many at once gets
/// a 503 past [`crate::inspect::MAX_STATUSES`] instead of forking that many processes, and
/// the ones held finish.
#[tokio::test]
async fn statuses_past_the_cap_are_a_503_and_fork_nothing() {
    use crate::inspect::MAX_STATUSES;
    let (f, _, fake) = inspecting();
    scheduled(&f, "a.service", &[HERE]).await;
    let gate = fake.hold_statuses();
    let held: Vec<_> = (0..MAX_STATUSES)
        .map(|_| {
            let router = f.router.clone();
            tokio::spawn(async move {
                let req = Request::get("/fleet/v1/units/a.service/status")
                    .body(Body::empty())
                    .unwrap();
                router.oneshot(req).await.unwrap().status()
            })
        })
        .collect();
    while fake.calls().len() < MAX_STATUSES {
        tokio::task::yield_now().await;
    }
    let answer = f.get("/fleet/v1/units/a.service/status").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert_eq!(fake.calls().len(), MAX_STATUSES);
    gate.add_permits(MAX_STATUSES);
    for h in held {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
}
