//! The API's metrics, and `GET /metrics`: every metric fleetd registered, in the Prometheus
//! text format (version 0.0.4), or in OpenMetrics when the client's `Accept` asks for
//! `application/openmetrics-text` (as Prometheus does when it scrapes).
//!
//! Requests are counted by route template (`/units/{name}`, never the path asked, so that a
//! client naming 10,000 units makes one series, not 10,000), method and status code, and
//! timed by route. docs/operating.md lists every metric.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::fmt::{self, Write};
use std::time::Duration;

/// Where the metrics are served, outside fleet's prefixes (as fleet served them).
pub const PATH: &str = "/metrics";

/// The OpenMetrics content type `prometheus-client` writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A request's method, as a label: fleet's API uses these four.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum MethodLabel {
    Get,
    Put,
    Delete,
    Patch,
    Other,
}

impl MethodLabel {
    pub fn of(method: &Method) -> MethodLabel {
        match *method {
            Method::GET => MethodLabel::Get,
            Method::PUT => MethodLabel::Put,
            Method::DELETE => MethodLabel::Delete,
            Method::PATCH => MethodLabel::Patch,
            _ => MethodLabel::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MethodLabel::Get => "GET",
            MethodLabel::Put => "PUT",
            MethodLabel::Delete => "DELETE",
            MethodLabel::Patch => "PATCH",
            MethodLabel::Other => "other",
        }
    }
}

impl EncodeLabelValue for MethodLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    method: MethodLabel,
    code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServedLabels {
    served: &'static str,
}

type Latency = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// 0.5 ms to about 16 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The API's metric families; clones share them. [`Metrics::default`] is detached (tests,
/// the bench): it counts, and nobody serves it.
#[derive(Debug, Clone)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    duration: Latency,
    held_pages: Family<ServedLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            duration: Latency::new_with_constructor(latency),
            held_pages: Family::default(),
        }
    }
}

impl Metrics {
    /// New families, registered in `registry` (fleetd gives the `fleet_api` one).
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "requests",
            "API requests answered, by route template, method and status code",
            m.requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time to answer API requests, by route template",
            Unit::Seconds,
            m.duration.clone(),
        );
        registry.register(
            "held_view_pages",
            "Pages of the unit listing asked of the held view, by what served them: `view`, or why etcd did (`unreadable`, `starting`, `lost`, `behind`, `moved`)",
            m.held_pages.clone(),
        );
        // Each way a page can be served, at 0 from the start: an alert on the rate of pages
        // etcd served instead of the view sees nothing of a series that does not exist yet.
        // Requests stay unset until answered: their status codes are an open set.
        let served = std::iter::once("view").chain(crate::held::Bypass::ALL.map(|b| b.as_str()));
        for served in served {
            m.held_pages.get_or_create_owned(&ServedLabels { served });
        }
        m
    }

    /// One page of the unit listing asked of the held view, served as `served` says.
    pub(crate) fn held_page(&self, served: &'static str) {
        self.held_pages
            .get_or_create(&ServedLabels { served })
            .inc();
    }

    /// Pages counted by [`held_page`](Self::held_page) as `served` (for tests).
    pub fn held_pages(&self, served: &'static str) -> u64 {
        self.held_pages
            .get_or_create(&ServedLabels { served })
            .get()
    }

    pub(crate) fn answered(
        &self,
        route: &'static str,
        method: &Method,
        code: StatusCode,
        took: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                method: MethodLabel::of(method),
                code: code.as_u16(),
            })
            .inc();
        self.duration
            .get_or_create(&RouteLabels { route })
            .observe(took.as_secs_f64());
    }

    /// Requests of `route` answered with `code` so far, any method (for tests).
    pub fn requests(&self, route: &'static str, method: &Method, code: StatusCode) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                method: MethodLabel::of(method),
                code: code.as_u16(),
            })
            .get()
    }
}

/// `registry` encoded for a client whose request carried `headers`. An encoding error (a
/// label value the format cannot carry) is a 500.
pub(crate) fn exposition(registry: &Registry, headers: &HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let mut text = String::new();
    let (encoded, content_type) = match openmetrics {
        true => (
            prometheus_client::encoding::text::encode(&mut text, registry),
            OPENMETRICS,
        ),
        false => (
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry),
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        ),
    };
    let (status, body) = match encoded {
        Ok(()) => (StatusCode::OK, text),
        Err(fmt::Error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding metrics failed\n".to_owned(),
        ),
    };
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

#[cfg(test)]
mod tests;
