use super::*;
use crate::{Api, router};
use axum::Router;
use fleet_registry::Registry as FleetRegistry;
use fleet_registry::kv::MemKv;
use http::Request;
use http_body_util::BodyExt;
use std::sync::Arc;
use tower::ServiceExt;

/// The API over the in-memory registry, serving a registry that holds its own metrics.
fn served() -> (Router, Metrics) {
    let mut registry = Registry::with_prefix("fleet");
    let metrics = Metrics::register(registry.sub_registry_with_prefix("api"));
    let api = Api::new(FleetRegistry::new(MemKv::new(), "/fleet/"), 100, "9.9.9")
        .with_metrics(metrics.clone(), Arc::new(registry));
    (router(api), metrics)
}

async fn get(router: &Router, path: &str, accept: Option<&str>) -> (StatusCode, String, String) {
    let mut req = Request::builder().method(Method::GET).uri(path);
    if let Some(accept) = accept {
        req = req.header(header::ACCEPT, accept);
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn metrics_are_served_as_prometheus_text_with_requests_by_route_template() {
    let (router, metrics) = served();
    assert_eq!(
        get(&router, "/fleet/v1/units/a.service", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&router, "/v1-alpha/units/b.service", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&router, "/fleet/v1/units", None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(&router, "/no/such/path", None).await.0,
        StatusCode::NOT_FOUND
    );
    let (status, content_type, text) = get(&router, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(
        text.contains(
            "fleet_api_requests_total{route=\"/units/{name}\",method=\"GET\",code=\"404\"} 2"
        ),
        "{text}"
    );
    assert!(
        text.contains("fleet_api_requests_total{route=\"/units\",method=\"GET\",code=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("route=\"other\""), "{text}");
    assert!(
        !text.contains("a.service"),
        "a raw path is never a label: {text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    // The scrape itself is counted once it is answered.
    assert_eq!(metrics.requests(PATH, &Method::GET, StatusCode::OK), 1);
}

#[tokio::test]
async fn a_client_asking_for_openmetrics_gets_it() {
    let (router, _) = served();
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (status, content_type, text) = get(&router, "/metrics", Some(accept)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, OPENMETRICS);
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[tokio::test]
async fn metrics_answer_only_get_and_only_where_a_registry_is_served() {
    let (router, _) = served();
    let req = Request::builder()
        .method(Method::PUT)
        .uri(PATH)
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let bare = router_without_metrics();
    assert_eq!(get(&bare, PATH, None).await.0, StatusCode::NOT_FOUND);
}

fn router_without_metrics() -> Router {
    router(Api::new(
        FleetRegistry::new(MemKv::new(), "/fleet/"),
        100,
        "9.9.9",
    ))
}
