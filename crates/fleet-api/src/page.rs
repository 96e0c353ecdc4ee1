//! fleet's pagination: a page token is base64url (with padding) of the little-endian pair
//! `u16 limit, u16 page`. A server mints tokens for its own `token_limit` only and refuses
//! others, so a client never gets pages of a size the server did not choose.
//!
//! The unit listing mints longer tokens ([`UnitsToken`]): fleet's 4 bytes, then the listing's
//! etcd revision (`i64`, little-endian) and the cursor (the last unit key segment of the page,
//! UTF-8), so that the next page reads only its own keys, at the listing's revision. fleet's
//! clients pass a token back unchanged (its `client/http.go`), and the first 4 bytes are
//! still fleet's token of the same page; fleet's 4-byte tokens are still accepted.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE;

/// Which page of which size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageToken {
    pub limit: u16,
    /// 1-based.
    pub page: u16,
}

/// Why a page token was refused (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("too many values for page token")]
    TooMany,
    #[error("page token is not base64url")]
    NotBase64,
    #[error("page token must be 4 bytes, got {0}")]
    WrongLength(usize),
    #[error("token limit must be {0}")]
    WrongLimit(u16),
    #[error("token page must be greater than zero")]
    PageZero,
    #[error("page token must be 4 bytes, or {min} or more with a cursor, got {0}", min = CURSOR_AT + 1)]
    NoCursor(usize),
    #[error("page token's revision must be greater than zero")]
    RevisionZero,
    #[error("page token's cursor is not a unit key segment")]
    BadCursor,
}

/// Where a [`UnitsToken`]'s cursor starts: after fleet's 4 bytes and the revision.
const CURSOR_AT: usize = 12;

/// Where the next page of the unit listing starts: after the unit key segment `after`, read
/// at the listing's `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub revision: i64,
    pub after: String,
}

/// A token of the unit listing: fleet's, with the cursor of the page when the server minted
/// it (none in fleet's own 4-byte tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitsToken {
    pub page: PageToken,
    pub cursor: Option<Cursor>,
}

impl UnitsToken {
    pub fn encode(&self) -> String {
        let Some(cursor) = &self.cursor else {
            return self.page.encode();
        };
        let mut bytes = self.page.bytes().to_vec();
        bytes.extend_from_slice(&cursor.revision.to_le_bytes());
        bytes.extend_from_slice(cursor.after.as_bytes());
        URL_SAFE.encode(bytes)
    }

    pub fn decode(text: &str) -> Result<UnitsToken, PageError> {
        let bytes = URL_SAFE.decode(text).map_err(|_| PageError::NotBase64)?;
        match bytes.len() {
            4 => Ok(UnitsToken {
                page: PageToken::from_bytes(&bytes)?,
                cursor: None,
            }),
            n if n <= CURSOR_AT => Err(PageError::NoCursor(n)),
            _ => {
                let (head, after) = bytes.split_at(CURSOR_AT);
                let revision =
                    i64::from_le_bytes(head[4..].try_into().map_err(|_| PageError::BadCursor)?);
                let after = String::from_utf8(after.to_vec()).map_err(|_| PageError::BadCursor)?;
                Ok(UnitsToken {
                    page: PageToken::from_bytes(&head[..4])?,
                    cursor: Some(Cursor { revision, after }),
                })
            }
        }
    }

    /// The token a request of the unit listing asks for, checked as
    /// [`PageToken::from_request`] checks fleet's, and its cursor: a revision above zero and
    /// a segment that a unit key could end with (not empty, no `/`, no NUL).
    pub fn from_request(values: &[String], limit: u16) -> Result<UnitsToken, PageError> {
        let token = match values {
            [] => {
                return Ok(UnitsToken {
                    page: PageToken::first(limit),
                    cursor: None,
                });
            }
            [one] => UnitsToken::decode(one)?,
            _ => return Err(PageError::TooMany),
        };
        token.page.check(limit)?;
        if let Some(cursor) = &token.cursor {
            if cursor.revision <= 0 {
                return Err(PageError::RevisionZero);
            }
            if cursor.after.is_empty() || cursor.after.contains(['/', '\0']) {
                return Err(PageError::BadCursor);
            }
        }
        Ok(token)
    }

    /// The token of the page after this one, which ends at `cursor`; the page number stops
    /// at the last a `u16` holds, the cursor tells where the page is.
    pub fn next(&self, cursor: Cursor) -> UnitsToken {
        UnitsToken {
            page: PageToken {
                limit: self.page.limit,
                page: self.page.page.saturating_add(1),
            },
            cursor: Some(cursor),
        }
    }
}

impl PageToken {
    pub fn first(limit: u16) -> PageToken {
        PageToken { limit, page: 1 }
    }

    /// The token of the following page; none after the last page a `u16` can number.
    pub fn next(self) -> Option<PageToken> {
        Some(PageToken {
            limit: self.limit,
            page: self.page.checked_add(1)?,
        })
    }

    pub fn encode(self) -> String {
        URL_SAFE.encode(self.bytes())
    }

    fn bytes(self) -> [u8; 4] {
        let mut bytes = [0u8; 4];
        bytes[..2].copy_from_slice(&self.limit.to_le_bytes());
        bytes[2..].copy_from_slice(&self.page.to_le_bytes());
        bytes
    }

    pub fn decode(text: &str) -> Result<PageToken, PageError> {
        let bytes = URL_SAFE.decode(text).map_err(|_| PageError::NotBase64)?;
        PageToken::from_bytes(&bytes)
    }

    fn from_bytes(bytes: &[u8]) -> Result<PageToken, PageError> {
        let [l0, l1, p0, p1] = bytes[..] else {
            return Err(PageError::WrongLength(bytes.len()));
        };
        Ok(PageToken {
            limit: u16::from_le_bytes([l0, l1]),
            page: u16::from_le_bytes([p0, p1]),
        })
    }

    /// fleet's checks of a token for a server whose page size is `limit`.
    fn check(self, limit: u16) -> Result<(), PageError> {
        if self.limit != limit {
            return Err(PageError::WrongLimit(limit));
        }
        if self.page == 0 {
            return Err(PageError::PageZero);
        }
        Ok(())
    }

    /// The token a request asks for (its `nextPageToken` values), for a server whose page
    /// size is `limit`: the first page when there is none.
    pub fn from_request(values: &[String], limit: u16) -> Result<PageToken, PageError> {
        let token = match values {
            [] => return Ok(PageToken::first(limit)),
            [one] => PageToken::decode(one)?,
            _ => return Err(PageError::TooMany),
        };
        token.check(limit)?;
        Ok(token)
    }

    /// This token's page of `items`, and the token of the next page if anything is left.
    /// Unlike fleet, a last page that is exactly full gets no token to an empty page.
    pub fn slice<T>(self, mut items: Vec<T>) -> (Vec<T>, Option<PageToken>) {
        let limit = usize::from(self.limit);
        let start = usize::from(self.page - 1) * limit;
        if start >= items.len() {
            return (Vec::new(), None);
        }
        let more = items.len() > start + limit;
        items.truncate(start + limit);
        let page = items.split_off(start);
        (page, if more { self.next() } else { None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_page_two_of_a_hundred_as_fleet_does() {
        let token = PageToken {
            limit: 100,
            page: 2,
        };
        assert_eq!(token.encode(), "ZAACAA==");
        assert_eq!(PageToken::decode("ZAACAA=="), Ok(token));
    }

    #[test]
    fn every_token_round_trips() {
        for (limit, page) in [(1, 1), (100, 65535), (65535, 7), (255, 256)] {
            let token = PageToken { limit, page };
            assert_eq!(PageToken::decode(&token.encode()), Ok(token));
        }
    }

    #[test]
    fn refuses_a_token_minted_for_another_limit() {
        // fleet's functional test sends this one: limit 19.
        let values = vec!["EwBMLg==".to_owned()];
        assert_eq!(
            PageToken::from_request(&values, 100),
            Err(PageError::WrongLimit(100))
        );
        assert_eq!(
            PageError::WrongLimit(100).to_string(),
            "token limit must be 100"
        );
    }

    #[test]
    fn refuses_malformed_tokens_page_zero_and_two_tokens() {
        let one = |s: &str| vec![s.to_owned()];
        assert_eq!(
            PageToken::from_request(&one("not base64!"), 100),
            Err(PageError::NotBase64)
        );
        assert_eq!(
            PageToken::from_request(&one("ZAA="), 100),
            Err(PageError::WrongLength(2))
        );
        let zero = PageToken {
            limit: 100,
            page: 0,
        }
        .encode();
        assert_eq!(
            PageToken::from_request(&one(&zero), 100),
            Err(PageError::PageZero)
        );
        let two = vec!["ZAACAA==".to_owned(), "ZAACAA==".to_owned()];
        assert_eq!(PageToken::from_request(&two, 100), Err(PageError::TooMany));
    }

    fn cursor_token(revision: i64, after: &str) -> UnitsToken {
        UnitsToken {
            page: PageToken {
                limit: 100,
                page: 2,
            },
            cursor: Some(Cursor {
                revision,
                after: after.to_owned(),
            }),
        }
    }

    #[test]
    fn a_cursor_token_round_trips_and_starts_with_fleets_token() {
        let token = cursor_token(1234, "a@1.service");
        let text = token.encode();
        assert_eq!(UnitsToken::decode(&text), Ok(token.clone()));
        assert_eq!(
            UnitsToken::from_request(std::slice::from_ref(&text), 100),
            Ok(token)
        );
        let bytes = URL_SAFE.decode(&text).unwrap();
        assert_eq!(
            URL_SAFE.encode(&bytes[..4]),
            "ZAACAA==",
            "fleet's page 2 of 100"
        );
        assert_eq!(&bytes[4..12], 1234i64.to_le_bytes());
    }

    #[test]
    fn the_unit_listing_still_takes_fleets_four_byte_tokens() {
        let values = vec!["ZAACAA==".to_owned()];
        assert_eq!(
            UnitsToken::from_request(&values, 100),
            Ok(UnitsToken {
                page: PageToken {
                    limit: 100,
                    page: 2
                },
                cursor: None
            })
        );
        assert_eq!(
            UnitsToken::from_request(&[], 7).unwrap().page,
            PageToken::first(7)
        );
    }

    #[test]
    fn refuses_cursor_tokens_that_a_server_never_minted() {
        let one = |t: &UnitsToken| vec![t.encode()];
        assert_eq!(
            UnitsToken::from_request(&one(&cursor_token(0, "a.service")), 100),
            Err(PageError::RevisionZero)
        );
        assert_eq!(
            UnitsToken::from_request(&one(&cursor_token(5, "")), 100),
            Err(PageError::NoCursor(12))
        );
        for bad in ["a/b.service", "a\0.service"] {
            assert_eq!(
                UnitsToken::from_request(&one(&cursor_token(5, bad)), 100),
                Err(PageError::BadCursor),
                "{bad:?}"
            );
        }
        let mut bytes = URL_SAFE.decode(cursor_token(5, "a").encode()).unwrap();
        bytes[12] = 0xff;
        assert_eq!(
            UnitsToken::from_request(&[URL_SAFE.encode(&bytes)], 100),
            Err(PageError::BadCursor),
            "not UTF-8"
        );
        let short = URL_SAFE.encode([100, 0, 2, 0, 1, 0, 0]);
        assert_eq!(
            UnitsToken::from_request(&[short], 100),
            Err(PageError::NoCursor(7))
        );
        assert_eq!(
            PageError::NoCursor(7).to_string(),
            "page token must be 4 bytes, or 13 or more with a cursor, got 7"
        );
        // fleet's checks hold for the first 4 bytes too.
        let other_limit = UnitsToken {
            page: PageToken { limit: 19, page: 2 },
            ..cursor_token(5, "a.service")
        };
        assert_eq!(
            UnitsToken::from_request(&one(&other_limit), 100),
            Err(PageError::WrongLimit(100))
        );
        let zero = UnitsToken {
            page: PageToken {
                limit: 100,
                page: 0,
            },
            ..cursor_token(5, "a.service")
        };
        assert_eq!(
            UnitsToken::from_request(&one(&zero), 100),
            Err(PageError::PageZero)
        );
        assert_eq!(
            UnitsToken::from_request(&["%%%".to_owned()], 100),
            Err(PageError::NotBase64)
        );
    }

    #[test]
    fn the_next_token_keeps_the_limit_and_stops_counting_at_the_last_page_number() {
        let last = UnitsToken {
            page: PageToken {
                limit: 100,
                page: u16::MAX,
            },
            cursor: None,
        };
        let cursor = Cursor {
            revision: 9,
            after: "z.service".to_owned(),
        };
        let next = last.next(cursor.clone());
        assert_eq!(
            next.page,
            PageToken {
                limit: 100,
                page: u16::MAX
            }
        );
        assert_eq!(next.cursor, Some(cursor));
    }

    #[test]
    fn no_token_means_the_first_page() {
        assert_eq!(PageToken::from_request(&[], 5), Ok(PageToken::first(5)));
    }

    #[test]
    fn slices_pages_and_stops_after_the_last_item() {
        let items: Vec<u32> = (0..7).collect();
        let first = PageToken::first(3);
        let (page, next) = first.slice(items.clone());
        assert_eq!(page, vec![0, 1, 2]);
        let next = next.unwrap();
        let (page, next) = next.slice(items.clone());
        assert_eq!(page, vec![3, 4, 5]);
        let (page, next) = next.unwrap().slice(items.clone());
        assert_eq!((page, next), (vec![6], None));
        let exact: Vec<u32> = (0..6).collect();
        let second = PageToken { limit: 3, page: 2 };
        assert_eq!(second.slice(exact), (vec![3, 4, 5], None));
        let past = PageToken { limit: 3, page: 9 };
        assert_eq!(past.slice(items), (vec![], None));
    }
}
