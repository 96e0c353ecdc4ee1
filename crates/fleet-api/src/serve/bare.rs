//! fleet's JSON error entity on the answers hyper makes by itself (issue 38). A request whose
//! head hyper cannot parse or hold (a request target of 64 KiB, more than 100 headers, a
//! malformed request line) never reaches the router: hyper writes a bare `400`, `414` or
//! `431` with an empty body and closes the connection. docs/api.md promises the error entity
//! for every error, so [`BareErrors`] replaces such a response, as it is written, with the same
//! status carrying the entity. It recognises hyper's own: one of those statuses, an empty
//! body, and no `server` header (every response of the router names the server). Everything
//! else passes through untouched.

use serde_json::json;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's stream whose hyper-made error answers carry the error entity.
pub struct BareErrors<S> {
    inner: S,
    /// Our answer in place of hyper's, and how much of it is written.
    pending: Vec<u8>,
    sent: usize,
}

impl<S> BareErrors<S> {
    pub fn new(inner: S) -> BareErrors<S> {
        BareErrors {
            inner,
            pending: Vec::new(),
            sent: 0,
        }
    }
}

/// The most hyper's own error answer takes: a status line and three short headers.
const BARE_HEAD_MAX: usize = 512;

/// The status of `written` if it is one of hyper's own error answers. Cheap on anything
/// else: a body written in many pieces is looked at only for its first bytes.
fn bare_status(written: &[u8]) -> Option<u16> {
    if written.len() > BARE_HEAD_MAX || !written.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&written[..end])
        .ok()?
        .to_ascii_lowercase();
    let status: u16 = head.strip_prefix("http/1.1 ")?.get(..3)?.parse().ok()?;
    let hypers = matches!(status, 400 | 414 | 431)
        && head.contains("\r\ncontent-length: 0")
        && !head.contains("\r\nserver:")
        && written.len() == end + 4;
    hypers.then_some(status)
}

/// The answer with the error entity, for `status`.
fn answer(status: u16) -> Vec<u8> {
    let (reason, message) = match status {
        414 => (
            "URI Too Long",
            "the request target is too long (at most 65534 bytes)",
        ),
        431 => (
            "Request Header Fields Too Large",
            "the request's header fields are too large or too many (at most 100 headers)",
        ),
        _ => ("Bad Request", "malformed request"),
    };
    let body = json!({"error": {"code": status, "message": message}}).to_string();
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl<S: AsyncWrite + Unpin> BareErrors<S> {
    /// Writes what is left of our answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `written` in place of writing it, if it is one of hyper's own error answers.
    fn intercept(
        &mut self,
        cx: &mut Context<'_>,
        written: &[u8],
    ) -> Option<Poll<io::Result<usize>>> {
        let status = bare_status(written)?;
        self.pending = answer(status);
        self.sent = 0;
        // Ours goes out now or at the flush that follows; hyper's bytes count as written.
        Some(match self.drain(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) | Poll::Pending => Poll::Ready(Ok(written.len())),
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for BareErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for BareErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(poll) = self.intercept(cx, buf) {
            return poll;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        // hyper's own answers are a head alone, in one slice.
        let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (nonempty.next(), nonempty.next())
            && let Some(poll) = self.intercept(cx, only)
        {
            return poll;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_own_error_answers_are_recognised() {
        let hypers = b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(bare_status(hypers), Some(414));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nserver: fleetd/1\r\n\r\n";
        assert_eq!(bare_status(ours), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx";
        assert_eq!(bare_status(with_body), None);
        let mut long = hypers.to_vec();
        long.resize(BARE_HEAD_MAX + 1, b'x');
        assert_eq!(bare_status(&long), None, "only a short head is looked into");
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(bare_status(ok), None);
    }

    #[test]
    fn the_answer_carries_the_entity_with_the_same_status() {
        let text = String::from_utf8(answer(431)).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        let entity: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(entity["error"]["code"], 431);
    }
}
