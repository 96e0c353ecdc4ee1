//! The dashboard's routes (issue 42): the page and its assets with their security headers,
//! the overview, and the rule that a browser's write carries the dashboard's header.

use super::*;
use crate::routes::ui;
use std::sync::Arc;

async fn raw(f: &Fixture, path: &str) -> (StatusCode, http::HeaderMap, String) {
    let req = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = f.router.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn the_page_and_its_assets_come_with_a_strict_content_security_policy() {
    let (f, _) = fixture(100);
    let (status, headers, _) = raw(&f, "/ui").await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(headers[header::LOCATION], "/ui/");
    for (path, kind) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let (status, headers, body) = raw(&f, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{path}"
        );
        let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self'"));
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert!(!body.is_empty());
    }
    let (_, _, index) = raw(&f, "/ui/").await;
    assert!(
        index.matches("<script").count() == index.matches("<script src=").count(),
        "no inline script: {index}"
    );
    let (status, _, _) = raw(&f, "/ui/nothing.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        f.request(Method::POST, "/ui/").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// The page writes data as text only: a guard against a later edit that reaches for markup.
#[test]
fn the_script_never_writes_markup() {
    let script = include_str!("../routes/ui/app.js");
    for markup in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
    ] {
        assert!(!script.contains(markup), "app.js uses {markup}");
    }
}

fn delete_from(origin: Option<&str>, csrf: bool) -> Request<Body> {
    let mut req = Request::builder()
        .method(Method::DELETE)
        .uri("/fleet/v1/units/a.service");
    if let Some(origin) = origin {
        req = req
            .header(header::ORIGIN, origin)
            .header("sec-fetch-site", "same-origin");
    }
    if csrf {
        req = req.header(ui::CSRF_HEADER, "1");
    }
    req.body(Body::empty()).unwrap()
}

/// Issue 42: a browser sends its certificate to any site's request; a write from a browser
/// without the dashboard's header is refused and writes nothing. fleet's own clients send
/// no `Origin` and are not concerned.
#[tokio::test]
async fn a_browsers_write_without_the_dashboards_header_is_refused_and_writes_nothing() {
    let (f, _) = fixture(100);
    let put = f
        .put(
            "/fleet/v1/units/a.service",
            json!({"desiredState": "loaded", "options": options("/bin/true")}),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let refused = f
        .send(delete_from(Some("https://evil.example"), false))
        .await;
    assert_error(
        &refused,
        StatusCode::FORBIDDEN,
        "a browser's request that changes anything must carry the X-Fleet-CSRF header the \
         dashboard sets; refused as possibly sent by another site",
    );
    assert!(f.unit("a.service").await.is_some(), "nothing was written");
    let ok = f.send(delete_from(Some("http://fleetd"), true)).await;
    assert_eq!(ok.status, StatusCode::NO_CONTENT, "{ok:?}");
    assert!(f.unit("a.service").await.is_none());
    let put = f
        .put(
            "/fleet/v1/units/a.service",
            json!({"desiredState": "loaded", "options": options("/bin/true")}),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED);
    let fleets_client = f.send(delete_from(None, false)).await;
    assert_eq!(fleets_client.status, StatusCode::NO_CONTENT);
}

#[tokio::test(start_paused = true)]
async fn the_overview_pages_machines_and_says_the_clients_role() {
    let (f, _) = fixture(100);
    cluster(&f).await;
    let put = f
        .put(
            "/fleet/v1/units/c.service",
            json!({"desiredState": "launched", "options": options("/bin/true")}),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED);
    let o = f.get("/ui/api/overview?perPage=1").await;
    assert_eq!(o.status, StatusCode::OK, "{o:?}");
    assert_eq!(
        o.body["role"], "admin",
        "the router in-process is the socket"
    );
    assert_eq!(
        (o.body["page"].as_u64(), o.body["pages"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(o.body["machines"][0]["id"], "m1");
    assert_eq!(o.body["counts"]["machines"], 2);
    assert_eq!(o.body["counts"]["units"], 1);
    assert_eq!(o.body["unscheduled"][0]["name"], "c.service");
    let filtered = f.get("/ui/api/overview?filter=ROLE%3Dm2").await;
    assert_eq!(filtered.body["matched"], 1);
    assert_eq!(filtered.body["machines"][0]["id"], "m2");
    let bad = f.get("/ui/api/overview?page=x").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "page must be a whole number");
}

/// Counts the requests that read more than one key: prefix ranges and multi-key reads.
#[derive(Debug, Clone, Default)]
struct Wide(Arc<std::sync::atomic::AtomicUsize>);

impl fleet_registry::kv::Hook for Wide {
    async fn before(
        &self,
        request: fleet_registry::kv::Request<'_>,
    ) -> Result<(), fleet_registry::kv::KvError> {
        use fleet_registry::kv::Request as R;
        if matches!(request, R::Range { prefix: true, .. } | R::Read(_)) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

async fn overview_of(router: &Router) -> Value {
    let req = Request::builder()
        .uri("/ui/api/overview")
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Issue 42: the cluster page of 100,000 units must not read the registry from etcd on
/// each change; it is built from the held view, at one revision, after every write made
/// before it.
#[tokio::test(start_paused = true)]
async fn the_overview_comes_from_the_held_view_and_reads_no_range_of_etcd() {
    let wide = Wide::default();
    let kv = fleet_registry::kv::Hooked {
        inner: MemKv::new(),
        hook: wide.clone(),
    };
    let registry = Registry::new(kv, "/fleet/");
    let info = MachineInfo {
        id: "m1".parse().unwrap(),
        public_ip: "10.0.0.1".into(),
        metadata: [("role".to_owned(), "web".to_owned())].into(),
        version: VERSION.into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    let running = [("a.service".parse().unwrap(), file("/bin/true").hash(), true)];
    machine_running(&registry, &info, Duration::from_secs(60), &running).await;
    let plain = router(Api::new(registry.clone(), 100, VERSION));
    let held = router(Api::new(registry.clone(), 100, VERSION).with_held_view(IDLE));
    assert_eq!(overview_of(&held).await, overview_of(&plain).await);
    UnitsRole::new(registry.clone())
        .create_unit(
            &"c.service".parse().unwrap(),
            &file("/bin/true"),
            DesiredState::Launched,
        )
        .await
        .unwrap();
    let before = wide.0.load(std::sync::atomic::Ordering::SeqCst);
    let o = overview_of(&held).await;
    assert_eq!(
        wide.0.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "no range of etcd read"
    );
    assert_eq!(o["unscheduled"][0]["name"], "c.service", "{o}");
    assert_eq!(o, overview_of(&plain).await);
    assert!(
        wide.0.load(std::sync::atomic::Ordering::SeqCst) > before,
        "without a view, the overview reads the registry"
    );
}

const IDLE: Duration = Duration::from_secs(60);

async fn open_stream(router: &Router) -> http::Response<Body> {
    let req = Request::builder()
        .uri("/ui/api/changes")
        .body(Body::empty())
        .unwrap();
    router.clone().oneshot(req).await.unwrap()
}

/// Each change stream holds a watch: past [`ui::MAX_STREAMS`] the API says so in its error
/// entity, and a stream the browser closed gives its place back.
#[tokio::test]
async fn past_the_stream_cap_the_api_refuses_and_a_closed_stream_frees_its_place() {
    let (f, _) = fixture(100);
    let mut open = Vec::new();
    for _ in 0..ui::MAX_STREAMS {
        let resp = open_stream(&f.router).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        open.push(resp);
    }
    let refused = f.get("/ui/api/changes").await;
    assert_error(
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "already serving {} dashboard change streams; try again later",
            ui::MAX_STREAMS
        ),
    );
    // The first event of a stream says it is open; then the browser goes away.
    let mut first = open.pop().unwrap().into_body();
    let opened = first.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(String::from_utf8_lossy(&opened).contains("event: change"));
    drop(first);
    let again = open_stream(&f.router).await;
    assert_eq!(again.status(), StatusCode::OK, "the closed stream's place");
    let refused = f.get("/ui/api/changes").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    drop(open);
    drop(again);
    let mut reopened = Vec::new();
    for _ in 0..ui::MAX_STREAMS {
        let resp = open_stream(&f.router).await;
        assert_eq!(resp.status(), StatusCode::OK, "every place given back");
        reopened.push(resp);
    }
}
