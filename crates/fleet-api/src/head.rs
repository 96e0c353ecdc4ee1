//! Checks of a request's head made before it is authorized or routed (issue 38): what the
//! HTTP layer would otherwise answer in its own way. A body announced larger than any route
//! takes is refused at once, before hyper sends `100 Continue` for it (a client that waits
//! for that would send megabytes only to be refused); an expectation other than
//! `100-continue` is refused (RFC 9110: 417), not ignored. Nothing here reads the body.

use axum::extract::Request;
use http::header;

use crate::error::ApiError;

/// Refuses `req` if its head asks for what no route gives; `max_body` is the largest body
/// any route reads.
pub fn check(req: &Request, max_body: usize) -> Result<(), ApiError> {
    let headers = req.headers();
    for expect in headers.get_all(header::EXPECT) {
        // A list (RFC 9110): empty members say nothing.
        let value = String::from_utf8_lossy(expect.as_bytes()).into_owned();
        for member in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            if !member.eq_ignore_ascii_case("100-continue") {
                return Err(ApiError::Expectation(member.to_owned()));
            }
        }
    }
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_body as u64) {
        return Err(ApiError::BodyTooLarge(max_body));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder()
            .method("PUT")
            .uri("/fleet/v1/units/a.service");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn a_body_announced_too_large_is_413_before_anything_is_read() {
        let req = request(&[("content-length", "9000000"), ("expect", "100-continue")]);
        assert!(matches!(
            check(&req, 4096),
            Err(ApiError::BodyTooLarge(4096))
        ));
        assert!(check(&request(&[("content-length", "4096")]), 4096).is_ok());
        assert!(check(&request(&[]), 4096).is_ok());
    }

    #[test]
    fn only_the_100_continue_expectation_is_met() {
        assert!(check(&request(&[("expect", "100-Continue")]), 10).is_ok());
        assert!(check(&request(&[("expect", "")]), 10).is_ok());
        assert!(check(&request(&[("expect", " , 100-continue")]), 10).is_ok());
        let err = check(&request(&[("expect", "teapot")]), 10).unwrap_err();
        assert_eq!(err.status(), http::StatusCode::EXPECTATION_FAILED);
        assert_eq!(err.to_string(), "unsupported expectation \"teapot\"");
    }
}
