//! The extensions (`?view=full`, `op=`, replace flags) that fleetctl's API driver uses, and
//! that default answers stay fleet's.

use super::*;
use fleet_registry::kv::{Hook, Hooked, KvError};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

async fn create(f: &Fixture, name: &str, exec: &str, state: &str) {
    let answer = f
        .put(
            &format!("/fleet/v1/units/{name}"),
            json!({"options": options(exec), "desiredState": state}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
}

async fn schedule(f: &Fixture, name: &str, machine: &str, exec: &str) {
    let entry = ScheduleEntry {
        name: name.parse().unwrap(),
        machine: machine.parse().unwrap(),
        hash: file(exec).hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    f.registry.write_schedule(&[entry], &[]).await.unwrap();
}

#[tokio::test]
async fn the_full_view_of_a_unit_adds_hash_machines_reason_and_generation() {
    let (f, _) = fixture(100);
    create(&f, "a.service", "/bin/true", "launched").await;
    schedule(&f, "a.service", "m2", "/bin/true").await;
    let unscheduled = f.registry.keys().unscheduled(&"a.service".parse().unwrap());
    f.registry
        .put_raw(&unscheduled, "no machine has tier=api")
        .await;
    let plain = f.get("/fleet/v1/units/a.service").await.body;
    assert_eq!(
        plain,
        json!({"name": "a.service", "options": options("/bin/true"),
               "desiredState": "launched", "currentState": "inactive", "machineID": "m2"})
    );
    let full = f.get("/fleet/v1/units/a.service?view=full").await.body;
    assert_eq!(full["hash"], file("/bin/true").hash().to_string());
    assert_eq!(full["machineIDs"], json!(["m2"]));
    assert_eq!(full["unscheduledReason"], "no machine has tier=api");
    let page = f.get("/fleet/v1/units?view=full").await.body;
    assert_eq!(page["units"][0], full);
    let page = f.get("/fleet/v1/units").await.body;
    assert_eq!(page["units"][0], plain);
}

#[tokio::test]
async fn the_full_view_of_units_takes_the_names_asked() {
    let (f, _) = fixture(100);
    for n in ["a.service", "b.service", "c.service"] {
        create(&f, n, "/bin/true", "inactive").await;
    }
    let page = f
        .get("/fleet/v1/units?view=full&unitName=c.service&unitName=a.service&unitName=x.service")
        .await
        .body;
    let names: Vec<&str> = page["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.service", "c.service"]);
    // fleet's view has no such parameter: every unit.
    let page = f.get("/fleet/v1/units?unitName=c.service").await.body;
    assert_eq!(page["units"].as_array().unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_full_view_of_states_and_machines_adds_generations_versions_and_the_notice() {
    let (f, _) = fixture(100);
    cluster(&f).await;
    f.registry
        .put_raw(&f.registry.keys().disruption(), "rescheduling held")
        .await;
    // A leader key without a lease leads nothing (issue 38): said beside the machines.
    f.registry
        .put_raw(&f.registry.keys().leader(), "ffff")
        .await;
    let page = f.get("/fleet/v1/machines?view=full").await.body;
    assert_eq!(page["disruptionNotice"], "rescheduling held");
    let leader = page["engineLeaderNotice"].as_str().unwrap_or_default();
    assert!(leader.contains("leads nothing (it has no lease)"), "{page}");
    assert_eq!(page["machines"][0]["version"], VERSION);
    let plain = f.get("/fleet/v1/machines").await.body;
    assert!(plain.get("disruptionNotice").is_none(), "{plain}");
    assert!(plain.get("engineLeaderNotice").is_none(), "{plain}");
    assert!(plain["machines"][0].get("version").is_none(), "{plain}");
    let states = f
        .get("/fleet/v1/state?view=full&unitName=a.service&unitName=b.service&machineID=m1")
        .await
        .body;
    assert_eq!(states["states"].as_array().unwrap().len(), 2, "{states}");
    let fleet = f
        .get("/fleet/v1/state?unitName=a.service&unitName=b.service&machineID=m1")
        .await
        .body;
    assert_eq!(fleet["states"].as_array().unwrap().len(), 1, "{fleet}");
    let evil = f
        .registry
        .keys()
        .state(&"m1".parse().unwrap(), &"evil.service".parse().unwrap());
    f.registry.put_raw(&evil, "not json").await;
    let states = f.get("/fleet/v1/state?view=full").await.body;
    let skipped = states["skipped"].as_array().unwrap();
    assert!(skipped[0].as_str().unwrap().contains(&evil));
    assert!(f.get("/fleet/v1/state").await.body.get("skipped").is_none());
}

#[tokio::test]
async fn a_full_view_put_answers_200_with_what_it_did() {
    let (f, _) = fixture(100);
    let path = "/fleet/v1/units/a.service?view=full";
    let answer = f.put(path, json!({"options": options("/bin/true")})).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(answer.body["outcome"], "created");
    assert_eq!(answer.body["unit"]["desiredState"], "inactive");
    // The same content without a state: unchanged (fleet's view refuses it with a 409).
    let answer = f.put(path, json!({"options": options("/bin/true")})).await;
    assert_eq!(
        (answer.status, &answer.body["outcome"]),
        (StatusCode::OK, &json!("unchanged"))
    );
    let fleet = f
        .put(
            "/fleet/v1/units/a.service",
            json!({"options": options("/bin/true")}),
        )
        .await;
    assert_eq!(fleet.status, StatusCode::CONFLICT);
    let answer = f.put(path, json!({"desiredState": "loaded"})).await;
    assert_eq!(answer.body["outcome"], "stateChanged");
    let answer = f.put(path, json!({"options": options("/bin/false")})).await;
    assert_eq!(answer.body["outcome"], "replaced");
    assert_eq!(answer.body["unit"]["desiredState"], "loaded");
}

#[tokio::test]
async fn replace_flags_reach_the_record() {
    let (f, _) = fixture(100);
    create(&f, "a.service", "/bin/true", "launched").await;
    schedule(&f, "a.service", "m1", "/bin/true").await;
    let answer = f
        .put(
            "/fleet/v1/units/a.service?noRestart=true&reschedule=true",
            json!({"options": options("/bin/false")}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let record = f.unit("a.service").await.unwrap().record;
    assert!(record.replace.no_restart);
    assert_eq!(record.replace.placement, 1);
    assert_eq!(record.replace.avoid, Some("m1".parse().unwrap()));
}

#[tokio::test]
async fn ops_stop_unload_raise_and_restart_follow_fleetctls_rules() {
    let (f, _) = fixture(100);
    create(&f, "a.service", "/bin/true", "inactive").await;
    let op = |op: &str| format!("/fleet/v1/units/a.service?view=full&op={op}");
    let stop = f.put(&op("stop"), json!({})).await;
    assert_eq!(stop.status, StatusCode::CONFLICT);
    assert_eq!(
        stop.body["error"]["detail"],
        "Unable to stop unit a.service in state inactive"
    );
    assert_eq!(stop.body["error"]["reason"], "stopInactive");
    let restart = f.put(&op("restart"), json!({})).await;
    assert_eq!(restart.body["error"]["reason"], "restartInactive");
    let raise = f.put(&op("raise"), json!({"desiredState": "loaded"})).await;
    assert_eq!(raise.body["outcome"], "stateChanged", "{raise:?}");
    let again = f
        .put(&op("raise"), json!({"desiredState": "inactive"}))
        .await;
    assert_eq!(again.body["outcome"], "unchanged");
    let restart = f.put(&op("restart"), json!({})).await;
    assert_eq!(restart.body["outcome"], "launched");
    let restart = f.put(&op("restart"), json!({})).await;
    assert_eq!(
        restart.body,
        json!({"outcome": "restarted", "restartGeneration": 1})
    );
    let stop = f.put(&op("stop"), json!({})).await;
    assert_eq!(stop.body["unit"]["desiredState"], "loaded");
    // The default view: 204, and fleet's error entity without the extensions.
    let unload = f
        .put("/fleet/v1/units/a.service?op=unload", json!({}))
        .await;
    assert_eq!(unload.status, StatusCode::NO_CONTENT);
    assert_eq!(
        f.unit("a.service").await.unwrap().desired(),
        DesiredState::Inactive
    );
    let stop = f.put("/fleet/v1/units/a.service?op=stop", json!({})).await;
    assert_error(
        &stop,
        StatusCode::CONFLICT,
        "Unable to stop unit a.service in state inactive",
    );
    let missing = f
        .put("/fleet/v1/units/gone.service?view=full&op=stop", json!({}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["reason"], "noSuchUnit");
}

#[tokio::test]
async fn a_bad_op_is_400_and_writes_nothing() {
    let (f, _) = fixture(100);
    create(&f, "a.service", "/bin/true", "inactive").await;
    let before = f.revision().await;
    let unknown = f
        .put("/fleet/v1/units/a.service?op=explode", json!({}))
        .await;
    assert_error(&unknown, StatusCode::BAD_REQUEST, "unknown op \"explode\"");
    let with_options = f
        .put(
            "/fleet/v1/units/a.service?op=stop",
            json!({"options": options("/bin/false")}),
        )
        .await;
    assert_error(
        &with_options,
        StatusCode::BAD_REQUEST,
        "op stop takes no options",
    );
    let raise = f.put("/fleet/v1/units/a.service?op=raise", json!({})).await;
    assert_error(
        &raise,
        StatusCode::BAD_REQUEST,
        "op raise needs a desiredState",
    );
    let machine = f
        .put(
            "/fleet/v1/units/a.service?op=advanceRollout&machineID=a/b",
            json!({}),
        )
        .await;
    assert_eq!(machine.status, StatusCode::BAD_REQUEST, "{machine:?}");
    assert_eq!(f.revision().await, before);
}

#[tokio::test]
async fn a_rolling_replace_is_advanced_and_finished_over_the_api() {
    let (f, _) = fixture(100);
    let global = json!([
        {"section": "Service", "name": "ExecStart", "value": "/bin/old"},
        {"section": "X-Fleet", "name": "Global", "value": "true"},
    ]);
    let new = json!([
        {"section": "Service", "name": "ExecStart", "value": "/bin/new"},
        {"section": "X-Fleet", "name": "Global", "value": "true"},
    ]);
    let path = "/fleet/v1/units/g.service";
    f.put(path, json!({"options": global, "desiredState": "launched"}))
        .await;
    let answer = f
        .put(&format!("{path}?rolling=true"), json!({"options": new}))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert!(
        f.unit("g.service")
            .await
            .unwrap()
            .record
            .replace
            .rollout
            .is_some()
    );
    let advanced = f
        .put(
            &format!("{path}?view=full&op=advanceRollout&machineID=m1&machineID=m2"),
            json!({}),
        )
        .await;
    assert_eq!(advanced.body["outcome"], "rolloutAdvanced", "{advanced:?}");
    let rollout = f.unit("g.service").await.unwrap().record.replace.rollout;
    assert_eq!(rollout.unwrap().updated.len(), 2);
    let finished = f
        .put(&format!("{path}?view=full&op=finishRollout"), json!({}))
        .await;
    assert_eq!(finished.body, json!({"outcome": "rolloutFinished"}));
    assert!(
        f.unit("g.service")
            .await
            .unwrap()
            .record
            .replace
            .rollout
            .is_none()
    );
}

#[tokio::test]
async fn a_full_view_delete_says_what_it_found() {
    let (f, _) = fixture(100);
    create(&f, "a.service", "/bin/true", "inactive").await;
    create(&f, "b.service", "/bin/false", "inactive").await;
    f.registry
        .put_raw(
            &f.registry.keys().unit(&"b.service".parse().unwrap()),
            "not json",
        )
        .await;
    let delete = |n: &str| format!("/fleet/v1/units/{n}?view=full");
    let answer = f.request(Method::DELETE, &delete("a.service")).await;
    assert_eq!(
        (answer.status, answer.body),
        (StatusCode::OK, json!({"outcome": "destroyed"}))
    );
    let answer = f.request(Method::DELETE, &delete("a.service")).await;
    assert_eq!(
        (answer.status, answer.body),
        (StatusCode::OK, json!({"outcome": "missing"}))
    );
    let answer = f.request(Method::DELETE, &delete("b.service")).await;
    assert_eq!(answer.body["outcome"], "unreadable");
    assert!(
        answer.body["detail"]
            .as_str()
            .unwrap()
            .contains("b.service")
    );
}

/// Counts the reads of single unit files, of the whole file prefix, and of any whole prefix.
#[derive(Debug, Clone, Default)]
struct FileReads {
    one: Arc<AtomicUsize>,
    all: Arc<AtomicUsize>,
    prefixes: Arc<AtomicUsize>,
}

impl Hook for FileReads {
    async fn before(&self, request: fleet_registry::kv::Request<'_>) -> Result<(), KvError> {
        match request {
            fleet_registry::kv::Request::Range { key, prefix } => {
                if prefix {
                    self.prefixes.fetch_add(1, Ordering::SeqCst);
                }
                if key.starts_with("/fleet/file/") {
                    let counter = if prefix { &self.all } else { &self.one };
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
            fleet_registry::kv::Request::Read(reads) => {
                let files = reads
                    .iter()
                    .filter(|r| r.end.is_none() && r.start.starts_with("/fleet/file/"))
                    .count();
                self.one.fetch_add(files, Ordering::SeqCst);
            }
            fleet_registry::kv::Request::Txn(_)
            | fleet_registry::kv::Request::Grant
            | fleet_registry::kv::Request::KeepAlive { .. }
            | fleet_registry::kv::Request::Revoke(_)
            | fleet_registry::kv::Request::Watch { .. } => {}
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_page_of_units_reads_the_files_of_that_page_only() {
    let reads = FileReads::default();
    let kv = Hooked {
        inner: MemKv::new(),
        hook: reads.clone(),
    };
    let registry = Registry::new(kv, "/fleet/");
    let units = UnitsRole::new(registry.clone());
    for i in 0..30 {
        units
            .create_unit(
                &format!("u{i:02}.service").parse().unwrap(),
                &file(&format!("/bin/{i}")),
                DesiredState::Inactive,
            )
            .await
            .unwrap();
    }
    let router = router(Api::new(registry, 10, VERSION));
    let mut url = "/fleet/v1/units".to_owned();
    let mut pages = 0;
    loop {
        let req = Request::builder().uri(&url).body(Body::empty()).unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["units"].as_array().unwrap().len(), 10);
        pages += 1;
        let Some(token) = body["nextPageToken"].as_str() else {
            break;
        };
        url = format!("/fleet/v1/units?nextPageToken={token}");
    }
    assert_eq!(pages, 3);
    assert_eq!(reads.one.load(Ordering::SeqCst), 30, "each file once");
    assert_eq!(reads.all.load(Ordering::SeqCst), 0, "never every file");
    assert_eq!(
        reads.prefixes.load(Ordering::SeqCst),
        0,
        "no page reads a whole prefix"
    );
}

#[tokio::test]
async fn the_full_view_takes_a_page_size_and_its_tokens() {
    let (f, _) = fixture(2);
    for n in ["a.service", "b.service", "c.service"] {
        create(&f, n, "/bin/true", "inactive").await;
    }
    let all = f.get("/fleet/v1/units?view=full&pageSize=500").await.body;
    assert_eq!(all["units"].as_array().unwrap().len(), 3);
    assert!(all.get("nextPageToken").is_none());
    let first = f.get("/fleet/v1/units?view=full&pageSize=1").await.body;
    let token = first["nextPageToken"].as_str().unwrap().to_owned();
    let second = f
        .get(&format!(
            "/fleet/v1/units?view=full&pageSize=1&nextPageToken={token}"
        ))
        .await
        .body;
    assert_eq!(second["units"][0]["name"], "b.service");
    // A token for page size 1 is not one for the server's 2.
    let other = f
        .get(&format!("/fleet/v1/units?view=full&nextPageToken={token}"))
        .await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);
    // 0 is the whole listing (`the_full_view_lists_states_machines_and_units_whole_...`).
    for bad in ["65536", "x", "-1"] {
        let answer = f
            .get(&format!("/fleet/v1/units?view=full&pageSize={bad}"))
            .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // fleet's view ignores it.
    let fleet = f.get("/fleet/v1/units?pageSize=500").await.body;
    assert_eq!(fleet["units"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn expect_makes_a_put_conditional_on_what_the_client_read() {
    let (f, _) = fixture(100);
    let path = "/fleet/v1/units/a.service?view=full";
    let body = |exec: &str| json!({"options": options(exec)});
    let created = f
        .put(&format!("{path}&expect=absent"), body("/bin/a"))
        .await;
    assert_eq!(created.body["outcome"], "created", "{created:?}");
    let before = f.revision().await;
    let refused = f
        .put(&format!("{path}&expect=absent"), body("/bin/b"))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.body["error"]["reason"], "conflict");
    let stale = file("/bin/other").hash();
    let refused = f
        .put(&format!("{path}&expect={stale}"), body("/bin/b"))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(f.revision().await, before);
    let read = file("/bin/a").hash();
    let replaced = f
        .put(&format!("{path}&expect={read}"), body("/bin/b"))
        .await;
    assert_eq!(replaced.body["outcome"], "replaced", "{replaced:?}");
    let bad = f.put(&format!("{path}&expect=xyz"), body("/bin/c")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

/// fleetctl's start of many new units sends its `expect=absent` creates concurrently; fleetd
/// writes them together (many units per etcd transaction), and each request still gets its
/// own answer, a refusal included.
#[tokio::test]
async fn concurrent_creates_are_written_together_and_each_gets_its_answer() {
    let (f, _) = fixture(100);
    let before = f.revision().await;
    let put = |name: String| {
        let f = &f;
        async move {
            let path = format!("/fleet/v1/units/{name}?view=full&expect=absent");
            let body = json!({"desiredState": "launched", "options": options("/bin/t")});
            (name, f.put(&path, body).await)
        }
    };
    let mut names: Vec<String> = (0..200).map(|i| format!("t@{i}.service")).collect();
    names.insert(100, "t@.service".into());
    let answers = futures::future::join_all(names.into_iter().map(put)).await;

    for (name, answer) in &answers {
        if name == "t@.service" {
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
            assert_eq!(answer.body["error"]["reason"], "activateTemplate");
        } else {
            assert_eq!(answer.body["outcome"], "created", "{name}: {answer:?}");
            assert!(f.unit(name).await.is_some(), "{name}");
        }
    }
    let revisions = f.revision().await - before;
    assert!(revisions < 50, "200 creates took {revisions} revisions");
}

/// `POST /units?view=full`: fleetctl's API driver creates many units in one request; each
/// gets the answer a `PUT ?expect=absent` of it alone would have had, in order, and the
/// valid ones are written together.
#[tokio::test]
async fn a_post_of_units_creates_each_as_its_own_put_would() {
    let (f, _) = fixture(100);
    create(&f, "old.service", "/bin/old", "inactive").await;
    let unit = |name: &str, exec: &str| json!({"name": name, "desiredState": "launched", "options": options(exec)});
    let mut units: Vec<Value> = (0..200)
        .map(|i| unit(&format!("t@{i}.service"), "/bin/t"))
        .collect();
    units.insert(10, unit("t@.service", "/bin/t"));
    units.insert(20, unit("old.service", "/bin/new"));
    units.insert(30, unit("old.service2", "/bin/t"));
    units.insert(
        40,
        json!({"name": "empty.service", "desiredState": "launched"}),
    );
    let answer = f
        .post("/fleet/v1/units?view=full", json!({"units": units}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 204);
    let error = |i: usize| (&results[i]["error"]["code"], &results[i]["error"]["reason"]);
    assert_eq!(error(10), (&json!(400), &json!("activateTemplate")));
    assert_eq!(error(20), (&json!(409), &json!("conflict")));
    assert_eq!(results[30]["error"]["code"], 400, "{:?}", results[30]);
    assert_eq!(error(40), (&json!(409), &json!("noOptions")));
    for (i, result) in results.iter().enumerate() {
        if [10, 20, 30, 40].contains(&i) {
            assert!(result.get("outcome").is_none(), "{result}");
            continue;
        }
        assert_eq!(result["outcome"], "created", "{i}: {result}");
        let name = result["unit"]["name"].as_str().unwrap();
        assert_eq!(name, units[i]["name"]);
        assert!(f.unit(name).await.is_some(), "{name}");
    }
    assert_eq!(
        f.unit("old.service").await.unwrap().hash(),
        file("/bin/old").hash(),
        "an existing unit is left as it was"
    );
    // A transaction that met the existing unit was written unit by unit (the etcd side's
    // create_many); 200 new units alone take a few transactions.
    let before = f.revision().await;
    let units: Vec<Value> = (0..200)
        .map(|i| unit(&format!("u@{i}.service"), "/bin/u"))
        .collect();
    let answer = f
        .post("/fleet/v1/units?view=full", json!({"units": units}))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let revisions = f.revision().await - before;
    assert!(revisions < 10, "200 creates took {revisions} revisions");
}

/// A `POST /units` that is not a list of distinct named units, or too long, is refused as a
/// whole with nothing written; without `view=full` it is fleet's 405.
#[tokio::test]
async fn a_post_of_units_refuses_a_bad_request_whole() {
    let (f, _) = fixture(100);
    let before = f.revision().await;
    let unit = |name: &str| json!({"name": name, "options": options("/bin/t")});
    let twice = json!({"units": [unit("a.service"), unit("b.service"), unit("a.service")]});
    let answer = f.post("/fleet/v1/units?view=full", twice).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "unit \"a.service\" is named twice in the request",
    );
    let nameless = json!({"units": [unit("a.service"), {"options": options("/bin/t")}]});
    let answer = f.post("/fleet/v1/units?view=full", nameless).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let many: Vec<Value> = (0..=fleet_api_wire::wire::MAX_CREATES)
        .map(|i| json!({"name": format!("a@{i}.service")}))
        .collect();
    let answer = f
        .post("/fleet/v1/units?view=full", json!({"units": many}))
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "a request creates at most 10000 units, got 10001",
    );
    let answer = f
        .post("/fleet/v1/units?view=full", json!({"units": "a.service"}))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let answer = f
        .post("/fleet/v1/units", json!({"units": [unit("a.service")]}))
        .await;
    assert_error(
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "only GET supported against this resource",
    );
    assert_eq!(f.revision().await, before, "nothing was written");
    assert!(f.unit("a.service").await.is_none());
}
