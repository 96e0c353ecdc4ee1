//! fleet's pagination: a page token is base64url (with padding) of the little-endian pair
//! `u16 limit, u16 page`. A server mints tokens for its own `token_limit` only and refuses
//! others, so a client never gets pages of a size the server did not choose.

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
        let mut bytes = [0u8; 4];
        bytes[..2].copy_from_slice(&self.limit.to_le_bytes());
        bytes[2..].copy_from_slice(&self.page.to_le_bytes());
        URL_SAFE.encode(bytes)
    }

    pub fn decode(text: &str) -> Result<PageToken, PageError> {
        let bytes = URL_SAFE.decode(text).map_err(|_| PageError::NotBase64)?;
        let [l0, l1, p0, p1] = bytes[..] else {
            return Err(PageError::WrongLength(bytes.len()));
        };
        Ok(PageToken {
            limit: u16::from_le_bytes([l0, l1]),
            page: u16::from_le_bytes([p0, p1]),
        })
    }

    /// The token a request asks for (its `nextPageToken` values), for a server whose page
    /// size is `limit`: the first page when there is none.
    pub fn from_request(values: &[String], limit: u16) -> Result<PageToken, PageError> {
        let token = match values {
            [] => return Ok(PageToken::first(limit)),
            [one] => PageToken::decode(one)?,
            _ => return Err(PageError::TooMany),
        };
        if token.limit != limit {
            return Err(PageError::WrongLimit(limit));
        }
        if token.page == 0 {
            return Err(PageError::PageZero);
        }
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
