//! A request's query string: its decoded values, the full view, and how a listing is paged
//! (token, page size, the whole listing). Parses only; reads nothing from the registry.

use percent_encoding::percent_decode_str;
use std::collections::BTreeSet;

use fleet_api_wire::wire;
use fleet_core::UnitName;

use super::Api;
use crate::error::ApiError;
use crate::page::PageToken;

/// What a request's query asks beyond fleet's parameters.
#[derive(Debug, Clone)]
pub(super) struct Query {
    pub(super) raw: String,
    /// `?view=full`: the extensions (docs/api.md "Extensions").
    pub(super) full: bool,
}

pub(crate) fn is_full(query: &str) -> bool {
    query_values(query, wire::VIEW)
        .iter()
        .any(|v| v == wire::VIEW_FULL)
}

/// `unitName` values that name units; None when there are none. A value that cannot name a
/// unit matches nothing.
pub(super) fn unit_names(query: &str) -> Option<BTreeSet<UnitName>> {
    let values = query_values(query, wire::UNIT_NAME);
    if values.is_empty() {
        return None;
    }
    Some(values.iter().filter_map(|v| v.parse().ok()).collect())
}

/// The page a request asks for. Pages hold `token_limit` entries, or in the full view the
/// `pageSize` asked (fleetctl lists 10,000 units in one request instead of 100); a token
/// carries its page size, so it must come with the same one.
fn page_token<K>(api: &Api<K>, query: &Query) -> Result<PageToken, ApiError> {
    let values = query_values(&query.raw, "nextPageToken");
    Ok(PageToken::from_request(&values, page_limit(api, query)?)?)
}

/// How a listing that reads everything for each page (states, machines) is cut.
pub(super) enum Paging {
    Pages(PageToken),
    /// The full view's `pageSize=0`: the whole listing in one page, read once; fleetctl
    /// asks so (100,000 states in pages of 65,535 read them all twice).
    Whole,
}

impl Paging {
    pub(super) fn slice<T>(&self, items: Vec<T>) -> (Vec<T>, Option<PageToken>) {
        match self {
            Paging::Pages(token) => token.slice(items),
            Paging::Whole => (items, None),
        }
    }

    pub(super) fn is_first(&self) -> bool {
        match self {
            Paging::Pages(token) => token.page == 1,
            Paging::Whole => true,
        }
    }
}

pub(super) fn listing_paging<K>(api: &Api<K>, query: &Query) -> Result<Paging, ApiError> {
    if whole_asked(query)? {
        return Ok(Paging::Whole);
    }
    Ok(Paging::Pages(page_token(api, query)?))
}

/// Whether the full view's `pageSize=0` asks for the whole listing (never with a token).
pub(super) fn whole_asked(query: &Query) -> Result<bool, ApiError> {
    if query.full && first(&query.raw, wire::PAGE_SIZE).as_deref() == Some(wire::WHOLE_LISTING) {
        if !query_values(&query.raw, "nextPageToken").is_empty() {
            return Err(ApiError::WholeWithToken);
        }
        return Ok(true);
    }
    Ok(false)
}

/// Entries per page: `token_limit`, or the full view's `pageSize`.
pub(super) fn page_limit<K>(api: &Api<K>, query: &Query) -> Result<u16, ApiError> {
    match first(&query.raw, wire::PAGE_SIZE) {
        Some(size) if query.full => match size.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ApiError::BadPageSize(size)),
        },
        Some(_) | None => Ok(api.token_limit),
    }
}

pub(super) fn encode(token: Option<PageToken>) -> String {
    token.map(PageToken::encode).unwrap_or_default()
}

pub(super) fn first(query: &str, key: &str) -> Option<String> {
    query_values(query, key).into_iter().next()
}

/// Every value of `key` in a URL query, decoded as Go's `url.ParseQuery` does (`+` is a
/// space). A token's `=` padding may come unescaped: only the first `=` splits.
pub(crate) fn query_values(query: &str, key: &str) -> Vec<String> {
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k) == key).then(|| decode(v))
        })
        .collect()
}
