//! The listings (`GET /machines`, `/units`, `/state`): paging, the held view for whole
//! listings, fleet's entities. Split from `routes.rs`, which routes.

use super::*;

pub(super) async fn list_machines<K: Kv>(
    api: &Api<K>,
    query: &Query,
) -> Result<Response, ApiError> {
    let paging = listing_paging(api, query)?;
    let listing = api.cluster.machines().await?;
    let machines = listing
        .machines
        .iter()
        .map(|m| wire::Machine {
            leader: listing.leader.as_ref() == Some(&m.id),
            ..convert::machine_to_wire(m, query.full)
        })
        .collect();
    let (machines, next) = paging.slice(machines);
    let mut page = entity::MachinePage {
        machines,
        next_page_token: encode(next),
        ..Default::default()
    };
    if query.full && paging.is_first() {
        page.skipped = listing.skipped;
        page.disruption_notice = listing.notice.unwrap_or_default();
        page.engine_leader_notice = listing.leader_notice.unwrap_or_default();
    }
    Ok(json_response(StatusCode::OK, &page))
}

/// A page of the whole listing reads only its own units' keys and files, at the revision of
/// the listing's first page, which its `nextPageToken` carries with the page's last name
/// ([`crate::page::UnitsToken`]), so listing 100,000 units in pages reads each key once.
/// fleet's 4-byte tokens of a later page, and listings of named units, read a snapshot and
/// skip to their page, as before.
pub(super) async fn list_units<K: Kv>(api: &Api<K>, query: &Query) -> Result<Response, ApiError> {
    let names = if query.full {
        unit_names(&query.raw)
    } else {
        None
    };
    if whole_asked(query)? {
        return whole_units(api, query, names.as_ref()).await;
    }
    let limit = page_limit(api, query)?;
    let token = UnitsToken::from_request(&query_values(&query.raw, "nextPageToken"), limit)?;
    let take = usize::from(token.page.limit);
    let by_cursor = names.is_none() && (token.cursor.is_some() || token.page.page == 1);
    let (listing, next) = if by_cursor {
        let cursor = token.cursor.as_ref().map(|c| UnitsCursor {
            after: c.after.clone(),
            revision: c.revision,
        });
        let held = match &api.held {
            // A later page comes from the view only while it is at the first page's
            // revision: every page of a listing shows the registry at one revision.
            Some(held) => api.served(
                held.units_after(
                    api.cluster.registry(),
                    cursor.as_ref(),
                    PageLimit::units(take),
                    cursor.as_ref().map(|c| c.revision),
                    Report::Page,
                )
                .await?,
            ),
            None => None,
        };
        let (listing, next) = match held {
            Some(page) => page,
            None => {
                api.cluster
                    .units_after(cursor.as_ref(), PageLimit::units(take))
                    .await?
            }
        };
        let next = next.map(|c| {
            token.next(Cursor {
                revision: c.revision,
                after: c.after,
            })
        });
        (listing, next.map(|t| t.encode()))
    } else {
        let skip = usize::from(token.page.page - 1) * take;
        let (listing, more) = api.cluster.units_page(names.as_ref(), skip, take).await?;
        (listing, Some(encode(token.page.next().filter(|_| more))))
    };
    Ok(unit_page(listing, next.unwrap_or_default(), query.full))
}

/// The full view's `pageSize=0`: every unit (of `names`, or all) in one page at one
/// revision; from the held view when it can serve it, else one snapshot.
async fn whole_units<K: Kv>(
    api: &Api<K>,
    query: &Query,
    names: Option<&BTreeSet<UnitName>>,
) -> Result<Response, ApiError> {
    let held = match (&api.held, names) {
        (Some(held), None) => api
            .served(
                held.units_after(
                    api.cluster.registry(),
                    None,
                    PageLimit::WHOLE,
                    None,
                    Report::Whole,
                )
                .await?,
            )
            .map(|(listing, _)| listing),
        _ => None,
    };
    let listing = match held {
        Some(listing) => listing,
        None => api.cluster.units(names).await?,
    };
    Ok(streamed_unit_page(listing, query.full))
}

pub(super) async fn list_states<K: Kv>(api: &Api<K>, query: &Query) -> Result<Response, ApiError> {
    // The token first: a bad one is a 400 without a registry read.
    let paging = listing_paging(api, query)?;
    let machine = first(&query.raw, wire::MACHINE_ID);
    let units: Vec<String> = if query.full {
        query_values(&query.raw, wire::UNIT_NAME)
    } else {
        first(&query.raw, wire::UNIT_NAME).into_iter().collect()
    };
    // Named units: only their keys (issue 19), so a blocking start polling over the API
    // costs the same at 100,000 units as at 10.
    let named: BTreeSet<UnitName> = units.iter().filter_map(|u| u.parse().ok()).collect();
    let listing = if units.is_empty() {
        api.cluster.states(&StateFilter::default()).await?
    } else {
        api.cluster.states_of(&named).await?
    };
    // fleet's filters are exact strings: one that is no valid name matches nothing.
    // Written from the listing, not copied into owned entities first (issue 19).
    let states = listing
        .states
        .iter()
        .filter(|s| machine.as_ref().is_none_or(|m| s.machine.as_str() == m))
        .filter(|s| units.is_empty() || units.iter().any(|u| s.name.as_str() == u))
        .map(|s| convert::state_out(s, query.full))
        .collect();
    let (states, next) = paging.slice(states);
    let mut page = wire::UnitStatePageOut {
        states,
        next_page_token: encode(next),
        ..Default::default()
    };
    if query.full && paging.is_first() {
        page.skipped = listing.skipped;
    }
    Ok(json_response(StatusCode::OK, &page))
}
