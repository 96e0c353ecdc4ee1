//! What one client may hold of a listener (issue 37, item 3): at most [`MAX_PER_PEER`]
//! connections from one address ([`PeerSlots`]), and no write that stalls for longer than
//! [`WRITE_STALL`] ([`Stalled`]): a client that never reads its answer cannot keep its
//! connection, and so its slot, forever.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Connections one address may hold on one listener at once.
pub const MAX_PER_PEER: usize = 64;

/// How long a write may wait for the client to read before the connection is dropped.
pub const WRITE_STALL: Duration = Duration::from_secs(30);

/// The connections each address holds on one listener.
#[derive(Debug, Clone, Default)]
pub struct PeerSlots {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PeerSlots {
    /// A slot for `peer`, or None when it holds [`MAX_PER_PEER`] already.
    pub fn take(&self, peer: IpAddr) -> Option<PeerSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(peer).or_default();
        if *count >= MAX_PER_PEER {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            slots: self.clone(),
            peer,
        })
    }

    #[cfg(test)]
    fn held(&self, peer: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(&peer).copied().unwrap_or(0)
    }
}

/// One connection's slot; given back when dropped.
#[derive(Debug)]
pub struct PeerSlot {
    slots: PeerSlots,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// A stream whose writes fail with `TimedOut` once one has waited [`WRITE_STALL`] for the
/// client to read. Reads are untouched (hyper bounds the headers; the handlers the bodies).
pub struct Stalled<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write is pending.
    stall: Option<Pin<Box<Sleep>>>,
}

impl<S> Stalled<S> {
    pub fn new(inner: S) -> Stalled<S> {
        Stalled::with_limit(inner, WRITE_STALL)
    }

    pub fn with_limit(inner: S, limit: Duration) -> Stalled<S> {
        Stalled {
            inner,
            limit,
            stall: None,
        }
    }

    /// `Pending` arms the stall timer (once per wait); progress disarms it.
    fn guard<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stall = None;
            return poll;
        }
        let limit = self.limit;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read its answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

use std::future::Future;

impl<S: AsyncRead + Unpin> AsyncRead for Stalled<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stalled<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn one_address_holds_at_most_its_share_and_gets_slots_back() {
        let slots = PeerSlots::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..MAX_PER_PEER).map(|_| slots.take(a).unwrap()).collect();
        assert!(slots.take(a).is_none());
        assert!(slots.take(b).is_some(), "another address is served");
        drop(held);
        assert_eq!(slots.held(a), 0);
        assert!(slots.take(a).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_reads_fails_after_the_stall_limit() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut stream = Stalled::with_limit(ours, Duration::from_secs(5));
        let started = Instant::now();
        let err = stream.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
        use tokio::io::AsyncReadExt;
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut stream = Stalled::with_limit(ours, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 1024 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                total += theirs.read(&mut buf).await.unwrap();
            }
        });
        stream.write_all(&[0u8; 1024]).await.unwrap();
        reader.await.unwrap();
    }
}
