//! Request and response bodies: reading a request's body within a size and time limit, and
//! writing a unit listing, the whole one streamed in chunks. Owns no routing or paging
//! decisions; the handlers in `routes` choose what to read and what to list.

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use fleet_api_wire::convert;

use crate::entity;
use crate::error::{ApiError, json_response};

/// Largest request body read: a unit file may be 1 MiB, and JSON escaping can double it.
pub(super) const MAX_BODY: usize = 4 * 1024 * 1024;

/// The most of a refused request's body read to name its action in the refusal (issue 37):
/// a viewer's 4 MiB `PUT` costs this, not the body, before it is refused.
pub(super) const REFUSED_BODY_READ: usize = 64 * 1024;

/// A request's body, at most `limit` bytes, within [`crate::serve::BODY_TIMEOUT`] (issue 37:
/// a client sending a byte a second does not hold its connection for long).
pub(crate) async fn read_body(
    body: axum::body::Body,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
    match tokio::time::timeout(
        crate::serve::BODY_TIMEOUT,
        axum::body::to_bytes(body, limit),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        // Past the limit is the client's request being too large: 413 (issue 38).
        Ok(Err(e)) if too_large(&e) => Err(ApiError::BodyTooLarge(limit)),
        Ok(Err(e)) => Err(ApiError::ReadBody(e)),
        Err(_) => Err(ApiError::BodyTimeout(crate::serve::BODY_TIMEOUT)),
    }
}

/// Whether a body read failed at its length limit.
fn too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Units written into one streamed chunk of a whole listing.
const STREAMED_UNITS: usize = 512;

/// The whole listing as [`unit_page`] writes it, but serialized [`STREAMED_UNITS`] units at
/// a time as the client reads (issue 37): 100,000 units in the full view would otherwise be
/// one buffer of their whole JSON beside the listing itself.
pub(super) fn streamed_unit_page(listing: fleet_ops::UnitListing, full: bool) -> Response {
    if listing.units.is_empty() {
        return unit_page(listing, String::new(), full);
    }
    let skipped = if full { listing.skipped } else { Vec::new() };
    let units = listing.units;
    let chunks = futures::stream::unfold(Some(0usize), move |at| {
        let step = at.map(|at| {
            let end = (at + STREAMED_UNITS).min(units.len());
            let mut chunk = if at == 0 {
                b"{\"units\":[".to_vec()
            } else {
                b",".to_vec()
            };
            for (i, unit) in units[at..end].iter().enumerate() {
                if i > 0 {
                    chunk.push(b',');
                }
                let wire = convert::unit_to_wire(unit, full);
                serde_json::to_writer(&mut chunk, &wire).expect("API entities always serialize");
            }
            if end < units.len() {
                return (chunk, Some(end));
            }
            chunk.push(b']');
            if !skipped.is_empty() {
                chunk.extend_from_slice(b",\"skipped\":");
                serde_json::to_writer(&mut chunk, &skipped).expect("strings serialize");
            }
            chunk.push(b'}');
            (chunk, None)
        });
        std::future::ready(step.map(|(chunk, next)| {
            (
                Ok::<_, std::convert::Infallible>(bytes::Bytes::from(chunk)),
                next,
            )
        }))
    });
    let mut resp = (StatusCode::OK, axum::body::Body::from_stream(chunks)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) fn unit_page(
    listing: fleet_ops::UnitListing,
    next_page_token: String,
    full: bool,
) -> Response {
    let page = entity::UnitPage {
        units: listing
            .units
            .iter()
            .map(|u| convert::unit_to_wire(u, full))
            .collect(),
        next_page_token,
        skipped: if full { listing.skipped } else { Vec::new() },
    };
    json_response(StatusCode::OK, &page)
}

/// fleet's rule: exactly one `Content-Type`, `application/json` with any parameters.
pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let values: Vec<&HeaderValue> = headers.get_all(header::CONTENT_TYPE).iter().collect();
    let [value] = values[..] else {
        return Err(ApiError::ContentTypeCount(values.len()));
    };
    let media = value.to_str().unwrap_or("");
    let media = media.split(';').next().unwrap_or("").trim();
    if media != "application/json" {
        return Err(ApiError::NotJson);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37, item 3: a client that sends its headers and then its body slower than the
    /// body limit allows (here, never) is answered 408 once the limit has passed, so it does
    /// not hold its connection and slot for as long as it likes.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_is_a_408_at_the_body_limit() {
        let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let started = tokio::time::Instant::now();
        let e = read_body(axum::body::Body::from_stream(never), MAX_BODY)
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::BodyTimeout(_)), "{e:?}");
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), crate::serve::BODY_TIMEOUT);
    }
}
