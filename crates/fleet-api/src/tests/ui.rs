//! The dashboard's routes (issue 42): the page and its assets with their security headers,
//! the overview, and the rule that a browser's write carries the dashboard's header.

use super::*;
use crate::routes::ui;

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
